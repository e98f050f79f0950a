"""The lecture's kernels that are not part of the assignment (the FA2 forward is part 3 and
lives in the student's file): standard attention (§5.2), the backward of §7.4, and
Flash-Decoding's split and combine kernels (§8.4)."""

from .backward import flash_backward, flash_bwd_kernel, flash_bwd_preprocess_kernel
from .decoding import flash_decode, flash_decode_combine_kernel, flash_decode_split_kernel
from .standard import matmul_tiled_kernel, softmax_rows_kernel, standard_attention

__all__ = [
    "matmul_tiled_kernel", "softmax_rows_kernel", "standard_attention",
    "flash_bwd_preprocess_kernel", "flash_bwd_kernel", "flash_backward",
    "flash_decode_split_kernel", "flash_decode_combine_kernel", "flash_decode",
]
