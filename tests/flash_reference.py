"""A STAND-IN for the FlashAttention kernel, in plain torch, so that transformers' own flash
attention path runs on a CPU (labelled as such wherever it is used).

transformers' flash path (integrations/flash_attention.py -> modeling_flash_attention_utils.
_flash_attention_forward) decides per call which kernel entry to use: the varlen one with the
sequence boundaries (given as cu_seq_lens_*, or inferred from position_ids for ONE row), or the
plain causal one over each whole row. That decision is what packing depends on, and it is
transformers' real code here; only the two kernel functions it calls are replaced by these
reference versions (SDPA per sequence, same signatures as flash_attn's). The real kernels run in
scripts/gpu_checks/packing_flash.py on a GPU.
"""

from __future__ import annotations

import contextlib
import itertools

import torch
import torch.nn.functional as F


def _attend(q, k, v, softmax_scale, causal):
    """q, k, v: [tokens, heads, dim] of one sequence (k/v may have fewer heads: GQA)."""
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [heads, tokens, dim]
    if k.shape[0] != q.shape[0]:
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        v = v.repeat_interleave(q.shape[0] // v.shape[0], dim=0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale)
    return out.transpose(0, 1)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, deterministic=False):
    """[batch, tokens, heads, dim]: each row is ONE sequence (flash_attn.flash_attn_func)."""
    return torch.stack([_attend(q[b], k[b], v[b], softmax_scale, causal) for b in range(q.shape[0])])


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, deterministic=False):
    """[total tokens, heads, dim] with the sequences' bounds (flash_attn.flash_attn_varlen_func)."""
    bounds = cu_seqlens_q.tolist()
    assert bounds == cu_seqlens_k.tolist(), "self-attention: the same bounds for queries and keys"
    assert bounds[-1] == q.shape[0], f"the bounds cover {bounds[-1]} tokens, the batch has {q.shape[0]}"
    pieces = [_attend(q[a:b], k[a:b], v[a:b], softmax_scale, causal) for a, b in itertools.pairwise(bounds)]
    return torch.cat(pieces)


@contextlib.contextmanager
def reference_flash_kernel(name: str = "flash_attention_2"):
    """Make transformers' `name` attention call the reference kernel functions above (its
    lazy import is pre-filled, the way a successful import would fill it); restored after."""
    from transformers import modeling_flash_attention_utils as fa

    names = ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_flash_with_kvcache_fn",
             "_pad_fn", "_unpad_fn", "_process_flash_kwargs_fn", "_process_with_kvcache_kwargs_fn")
    saved = {n: getattr(fa, n) for n in names}
    fa._loaded_implementation = name
    fa._flash_fn, fa._flash_varlen_fn, fa._flash_with_kvcache_fn = flash_attn_func, flash_attn_varlen_func, None
    fa._pad_fn, fa._unpad_fn = fa._pad_input, fa._unpad_input
    fa._process_flash_kwargs_fn = fa._lazy_define_process_function(flash_attn_varlen_func)
    fa._process_with_kvcache_kwargs_fn = dict
    try:
        yield
    finally:
        for n, value in saved.items():
            setattr(fa, n, value)
