#!/usr/bin/env python3
"""Lists the tests the last ctest run of a build tree skipped, each with its reason.

  scripts/ctest_skips.py BUILD_DIR

ctest prints `***Skipped` and nothing else for a skipped test, even with --output-on-failure,
so a skip's reason (no CUDA device, a missing Python module) would stay hidden. This reads
BUILD_DIR/Testing/Temporary/LastTest.log, where ctest keeps every test's output:

- a test skipped by its SKIP_REGULAR_EXPRESSION (every gtest, on GTEST_SKIP) is marked there;
- a test skipped by its SKIP_RETURN_CODE is logged as passed, so a test that has that property
  (in the tree's CTestTestfile.cmake) and printed a line starting with "skipped:" counts as
  skipped (the tests of this repository print that line before they exit with the code).

The reason is the test's first line starting with "skipped:", else GTEST_SKIP's message.
Exit status 0 unless the log cannot be read (2), so it never hides a failing ctest's status:
run it after ctest and exit with ctest's status (the README's test command does).
"""
import os
import re
import sys

TESTING = re.compile(r"^\d+/\d+ Testing: (.+)$")
GTEST_SKIPPED_AT = re.compile(r":\d+: Skipped$")
PROPERTIES = re.compile(r"^set_tests_properties\((?:\[=*\[(.+?)\]=*\]|(\S+)) PROPERTIES ")


def read_log(path):
    """{test name: (output lines, status lines)} of a LastTest.log, in the log's order."""
    tests, name, output, status, part = {}, None, [], [], None
    for line in open(path, encoding="utf-8", errors="replace").read().splitlines():
        m = TESTING.match(line)
        if m:
            if name is not None:
                tests[name] = (output, status)
            name, output, status, part = m.group(1), [], [], "header"
        elif name is None:
            continue
        elif part == "header" and line == "Output:":
            part = "rule"  # the dashed line that opens the output
        elif part == "rule":
            part = "output"
        elif part == "output":
            if line == "<end of output>":
                part = "status"
            else:
                output.append(line)
        elif part == "status":
            status.append(line)
    if name is not None:
        tests[name] = (output, status)
    return tests


def skip_return_code_tests(build_dir):
    """Names of the tests that have a SKIP_RETURN_CODE, from the tree's CTestTestfile.cmake
    files (`ctest --show-only` would say it too, but it overwrites LastTest.log)."""
    names = set()
    for top, _, files in os.walk(build_dir):
        if "CTestTestfile.cmake" not in files:
            continue
        for line in open(os.path.join(top, "CTestTestfile.cmake"), encoding="utf-8",
                         errors="replace"):
            m = PROPERTIES.match(line)
            if m and " SKIP_RETURN_CODE " in line:
                names.add(m.group(1) or m.group(2))
    return names


def reason(output):
    for line in output:
        if line.strip().startswith("skipped:"):
            return line.strip()
    for i, line in enumerate(output):  # GTEST_SKIP: "file:line: Skipped", then its message
        if GTEST_SKIPPED_AT.search(line.strip()):
            message = [l.strip() for l in output[i + 1:i + 4] if l.strip()]
            if message and not message[0].startswith("[  SKIPPED ]"):
                return message[0]
    return "(no reason printed)"


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    build_dir = sys.argv[1]
    log = os.path.join(build_dir, "Testing", "Temporary", "LastTest.log")
    try:
        tests = read_log(log)
    except OSError as e:
        print(f"ctest_skips: cannot read {log}: {e.strerror}", file=sys.stderr)
        return 2
    by_code = skip_return_code_tests(build_dir)
    skipped = []
    for name, (output, status) in tests.items():
        by_regex = any(s.startswith("Skip regular expression found") for s in status)
        by_rc = (name in by_code and "Test Passed." in status
                 and any(l.strip().startswith("skipped:") for l in output))
        if by_regex or by_rc:
            skipped.append((name, reason(output)))
    if not skipped:
        print(f"ctest_skips: {build_dir}: no test was skipped")
        return 0
    print(f"ctest_skips: {build_dir}: {len(skipped)} test(s) skipped:")
    for name, why in skipped:
        print(f"  {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
