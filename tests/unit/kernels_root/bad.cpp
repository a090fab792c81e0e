// Compiled as a kernels file is (kernels_see_only_their_root): a header of src/ must not resolve.
#include "model/bert.h"

int kernels_root_bad() { return 0; }
