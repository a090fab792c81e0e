"""Two additions to torch 1.13 that transformers' ModernBERT module (4.48) needs; import this
module before `transformers.models.modernbert` (or ModernBertForMaskedLM from transformers).

Each shim is installed only where torch lacks the feature (torch >= 2.1 has both and is left
alone), and neither changes what a model computes:

* torch.compile (torch >= 2.0). ModernBERT decorates three methods with
  `@torch.compile(dynamic=True)` when its module is imported, so the import itself fails on
  1.13. The shim returns the function unchanged. torch.compile promises the same results as
  the uncompiled function, and the compiled methods are only called when
  config.reference_compile is true, which ModernBERT turns off on a CPU (_maybe_set_compile):
  the identity is what runs either way.
* nn.LayerNorm(..., bias=False) (torch >= 2.1). ModernBERT builds every norm with
  bias=config.norm_bias, a keyword 1.13's LayerNorm refuses. The shim is a subclass that takes
  the keyword and, for bias=False, holds no bias parameter (self.bias is None), as torch 2.1's
  does: F.layer_norm with a None bias adds nothing, the state dict has no ".bias" key, and
  isinstance(module, nn.LayerNorm) holds for the shim's modules and for the original's. For
  bias=True it is the original class's module exactly.
"""

import inspect

import torch

INSTALLED = []


def _identity_compile(model=None, **_options):
    if model is None:  # used as @torch.compile(...): a decorator
        return lambda fn: fn
    return model


class _LayerNorm(torch.nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine,
                         device=device, dtype=dtype)
        if not bias:
            self.register_parameter("bias", None)

    def reset_parameters(self):
        if self.elementwise_affine:
            torch.nn.init.ones_(self.weight)
            if self.bias is not None:
                torch.nn.init.zeros_(self.bias)


if not hasattr(torch, "compile"):
    torch.compile = _identity_compile
    INSTALLED.append("torch.compile = identity")

if "bias" not in inspect.signature(torch.nn.LayerNorm.__init__).parameters:
    torch.nn.LayerNorm = _LayerNorm
    INSTALLED.append("nn.LayerNorm(bias=...)")
