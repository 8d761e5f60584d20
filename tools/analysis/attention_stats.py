"""What the linear attentions attend to: dense attention rows, entropies and q–k distances.

Record the inputs of every :class:`LaplacianAttention` / :class:`PolarityAttention` of a model with
:func:`record_attentions` (forward hooks, removed afterwards; the layers are not changed), then
recompute, for chosen queries, the weights over keys that each layer applies to its values:

- LaplacianFormer (the layer's kernel ``K``, by default ``exp(-||a - b||_1 / lam)``, q is also
  the key, q~ the landmarks, ``W = K(q~, q~) + landmark_shift I`` solved by the layer's inverse)::

      A_i = C_i W^-1 C^T / clamp(C_i W^-1 C^T 1, den_eps)     C = K(q, q~) [N, m], C_i its row i

  so that the layer's ``y_i = A_i v``: :meth:`LaplacianAttention.attention_rows`, the layer's own
  attention with v the identity; with ``landmark_ratio=1`` ``A_i = K(q_i, q) / clamp(K(q_i, q) 1,
  den_eps)``. Nyström rows sum to one but may hold small negative entries. With
  ``inverse='conjugate_gradient'`` each key's column of ``C^T`` is solved on its own; the layer
  solves ``C^T v`` instead, so ``A v`` equals its output only as far as CG has converged (CG's
  iterates are not linear in the right-hand side).
- PolaFormer (``phi_s(q) = [q+, q-]``, ``phi_o(q) = [q-, q+]``, ``phi(k) = [k+, k-]``, n keys,
  the layer's power, fixed or learned)::

      S_ij = phi_s(q_i).phi(k_j) / (sum_l phi_s(q_i).phi(k_l) + n eps)     (same sign)
      O_ij = phi_o(q_i).phi(k_j) / (sum_l phi_o(q_i).phi(k_l) + n eps)     (opposite sign)

  so that the op's output is ``[S v1 || O v2]`` (:func:`polarity_attention_rows`); with
  ``polarity='same'`` the layer's output is ``S v`` and O is not a stream of it.
- Softmax over the same q and k: ``softmax(scale * q_i.k_j)`` (:func:`softmax_rows`).

Shapes: q [B, h, N, d], keys [B, h, n, d]; rows [B, h, Q, n] for Q selected queries.
"""
import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from mmlinattn.models.layers import LaplacianAttention, PolarityAttention
from mmlinattn.ops import polarity_features

LINEAR_ATTENTIONS = (LaplacianAttention, PolarityAttention)


@dataclasses.dataclass
class AttentionRecord:
    """One call of a linear-attention layer: its input, output and place in the model.

    ``stage`` numbers the block containers (e.g. ``stages.0.blocks``, ``block1``) holding a linear
    attention, in the order they run; ``block`` is the index inside the container.
    """
    name: str
    stage: int
    block: int
    module: nn.Module
    x: torch.Tensor  # [B, N, C]
    hw_shape: Tuple[int, int]
    output: torch.Tensor  # [B, N, C]


def _container_and_index(name: str) -> Tuple[str, int]:
    """'stages.0.blocks.1.attn' -> ('stages.0.blocks', 1); 'block1.0.attn' -> ('block1', 0)."""
    parts = name.split('.')
    if len(parts) >= 2 and parts[-2].isdigit():
        return '.'.join(parts[:-2]), int(parts[-2])
    return '.'.join(parts[:-1]), 0


def record_attentions(model: nn.Module, *inputs, **kwargs) -> List[AttentionRecord]:
    """Run ``model(*inputs, **kwargs)`` without gradients; return a record per call of a
    linear-attention layer.

    Forward hooks capture each layer's ``(x, hw_shape)`` and output; they are removed afterwards,
    so the model's normal forward passes are untouched.
    """
    records: List[AttentionRecord] = []
    containers: Dict[str, int] = {}

    def hook(name, module, args, hook_kwargs, output):
        x = args[0] if args else hook_kwargs['x']
        hw_shape = args[1] if len(args) > 1 else hook_kwargs['hw_shape']
        container, block = _container_and_index(name)
        stage = containers.setdefault(container, len(containers))
        records.append(
            AttentionRecord(name, stage, block, module, x.detach(),
                            (int(hw_shape[0]), int(hw_shape[1])), output.detach()))

    handles = [
        module.register_forward_hook(lambda m, a, k, o, name=name: hook(name, m, a, k, o),
                                     with_kwargs=True) for name, module in model.named_modules()
        if isinstance(module, LINEAR_ATTENTIONS)
    ]
    if not handles:
        raise ValueError(f'{type(model).__name__} has no LaplacianAttention or PolarityAttention '
                         'layer to record')
    try:
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return records


def laplacian_inputs(module: LaplacianAttention, x: torch.Tensor, hw_shape: Tuple[int, int]):
    """The layer's q [B, h, N, d], landmarks q~ [B, h, m, d] (None when ``landmark_ratio == 1``)
    and v [B, h, N, d], from :meth:`LaplacianAttention.attention_inputs`."""
    with torch.no_grad():
        return module.attention_inputs(x, hw_shape)


def polarity_inputs(module: PolarityAttention, x: torch.Tensor, hw_shape: Tuple[int, int]):
    """What the layer feeds its polarity op: q [B, h, N, d], k [B, h, n, d], v [B, h, n, d], the
    power [1, h, 1, d] and the key grid, from :meth:`PolarityAttention.attention_inputs`."""
    with torch.no_grad():
        q, k, v, _, power, kv_grid = module.attention_inputs(x, hw_shape)
    return q, k, v, power, kv_grid


def _select(q: torch.Tensor, query_index: Optional[torch.Tensor]) -> torch.Tensor:
    return q if query_index is None else q[..., query_index, :]


def polarity_attention_rows(
        q: torch.Tensor,
        k: torch.Tensor,
        power: torch.Tensor,
        eps: float = 1e-6,
        query_index: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same-sign rows ``S`` and opposite-sign rows ``O``, see the module docstring.

    q: [B, h, N, d], k: [B, h, n, d], power: [1, h, 1, d] -> two [B, h, Q, n]. The op's output is
    ``[S v1 || O v2]`` with ``v1, v2 = chunk(v, 2, -1)``, up to rounding.
    """
    q_pos, q_neg = polarity_features(_select(q, query_index), power)
    k_pos, k_neg = polarity_features(k, power)
    k_feat = torch.cat([k_pos, k_neg], dim=-1).transpose(-2, -1)  # [B, h, 2d, n]
    num_keys = k.shape[-2]
    same = torch.cat([q_pos, q_neg], dim=-1) @ k_feat
    opposite = torch.cat([q_neg, q_pos], dim=-1) @ k_feat
    return tuple(s / (s.sum(-1, keepdim=True) + num_keys * eps) for s in (same, opposite))


def softmax_rows(q: torch.Tensor,
                 k: torch.Tensor,
                 scale: float,
                 query_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``softmax_j(scale * q_i.k_j)``: q [B, h, N, d], k [B, h, n, d] -> [B, h, Q, n]."""
    return torch.softmax(scale * _select(q, query_index) @ k.transpose(-2, -1), dim=-1)


def row_entropy(rows: torch.Tensor) -> torch.Tensor:
    """``H_i = -sum_j p_ij ln p_ij`` (nats) with ``p_i = max(a_i, 0) / sum_j max(a_ij, 0)``.

    rows: [..., n] -> [...]. For non-negative rows that sum to one p = a; Nyström rows may carry
    small negative weights, which are dropped before renormalising (see :func:`negative_mass`).
    The uniform row over n keys has the maximum, ``ln n``.
    """
    p = rows.clamp(min=0)
    p = p / p.sum(-1, keepdim=True)
    return -torch.special.xlogy(p, p).sum(-1)


def negative_mass(rows: torch.Tensor) -> torch.Tensor:
    """``sum_j max(-a_ij, 0) / sum_j |a_ij|``: the share of a row's weight that is negative."""
    return (-rows).clamp(min=0).sum(-1) / rows.abs().sum(-1)


def query_subset(num_tokens: int, max_queries: Optional[int]) -> Optional[torch.Tensor]:
    """At most ``max_queries`` token indices spread evenly over ``0..num_tokens-1`` (None: all)."""
    if max_queries is None or num_tokens <= max_queries:
        return None
    return torch.linspace(0, num_tokens - 1, max_queries).round().long().unique()


def token_index(point_xy: Tuple[float, float], grid: Tuple[int, int]) -> int:
    """The token under ``(x, y)`` given as fractions of the image width and height, on an H x W
    token grid laid out row-major."""
    x, y = point_xy
    if not (0 <= x <= 1 and 0 <= y <= 1):
        raise ValueError(f'query points are fractions of the image size in [0, 1], got {point_xy}')
    height, width = grid
    return min(int(y * height), height - 1) * width + min(int(x * width), width - 1)


def pairwise_distances(q: torch.Tensor,
                       k: torch.Tensor,
                       query_index: Optional[torch.Tensor] = None,
                       exclude_self: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """L1 ``||q_i - k_j||_1`` and squared L2 ``||q_i - k_j||_2^2`` of the selected queries against
    every key: q [B, h, N, d], k [B, h, n, d] -> two [B, h, Q, n]. ``exclude_self`` (keys are the
    queries, as in LaplacianFormer) returns the pairs i != j only, flattened to [B, h, P]."""
    queries = _select(q, query_index).double()
    keys = k.double()
    l1 = torch.cdist(queries, keys, p=1)
    sq_l2 = torch.cdist(queries, keys, p=2)**2
    if exclude_self:
        rows = torch.arange(q.shape[-2]) if query_index is None else query_index
        keep = rows[:, None] != torch.arange(k.shape[-2])[None, :]
        l1, sq_l2 = l1[..., keep], sq_l2[..., keep]
    return l1, sq_l2


def kernel_scales(l1: torch.Tensor,
                  sq_l2: torch.Tensor,
                  lam: Optional[float] = None,
                  sigma: Optional[float] = None) -> Dict[str, float]:
    """Bandwidths of the two kernels drawn over the distance histograms.

    Laplacian ``exp(-l1 / lam)`` and Gaussian ``exp(-l2^2 / (2 sigma^2))``: the one given is the
    model's; the other is matched at the medians, i.e. both kernels take the same value at their
    median distance, ``lam * median(l2^2) = 2 sigma^2 median(l1)``. Neither given: ``lam`` is the
    median L1 distance.
    """
    median_l1 = float(l1.flatten().median())
    median_sq_l2 = float(sq_l2.flatten().median())
    if sigma is not None and lam is None:
        sigma = float(sigma)
        lam = 2 * sigma**2 * median_l1 / median_sq_l2 if median_sq_l2 > 0 else float('nan')
    else:
        lam = median_l1 if lam is None else float(lam)
        sigma = math.sqrt(lam * median_sq_l2 / (2 * median_l1)) if median_l1 > 0 else float('nan')
    return dict(lam=lam,
                sigma=sigma,
                median_l1=median_l1,
                median_sq_l2=median_sq_l2,
                kernel_at_median=math.exp(-median_l1 / lam))


@dataclasses.dataclass
class LayerStatistics:
    """The statistics of one recorded layer; lists hold one entry per head."""
    kind: str  # 'laplacian' | 'polarity'
    num_keys: int
    entropy: Dict[str, List[float]]  # stream name -> mean row entropy per head (nats)
    negative_mass: List[float]  # mean share of negative weight per head (Nyström rows)
    scales: Dict[str, float]
    softmax_scale: float
    l1: torch.Tensor  # the sampled q–k L1 distances, flattened (float64)
    sq_l2: torch.Tensor  # the same pairs' squared L2 distances


def attention_streams(
    record: AttentionRecord,
    query_index: Optional[torch.Tensor] = None
) -> Tuple[Dict[str, torch.Tensor], torch.Tensor, torch.Tensor, float, Tuple[int, int]]:
    """The layer's attention rows by stream name, its (q, keys), its softmax scale and key grid.

    LaplacianFormer: ``{'laplacian': A}`` (whatever the layer's kernel and inverse); keys are q;
    softmax scale ``1 / (sqrt(d) * layer.scale^2)`` on the layer's scaled q, i.e.
    ``softmax(q'.k' / sqrt(d))`` of the raw projection ``q' = W_q x`` (which is also the key).
    PolaFormer: ``{'same': S, 'opposite': O}``, or ``{'same': S}`` with ``polarity='same'``;
    softmax ``softmax(q.k / sqrt(d))`` of the q and k the polarity op receives.
    """
    module = record.module
    if isinstance(module, LaplacianAttention):
        q, landmarks, _ = laplacian_inputs(module, record.x, record.hw_shape)
        with torch.no_grad():
            rows = module.attention_rows(q, landmarks, query_index)
        softmax_scale = module.head_dims**-0.5 / module.scale**2
        return {'laplacian': rows}, q, q, softmax_scale, record.hw_shape
    q, k, _, power, kv_grid = polarity_inputs(module, record.x, record.hw_shape)
    same, opposite = polarity_attention_rows(q, k, power, module.eps, query_index)
    streams = {'same': same} if module.polarity == 'same' else {'same': same, 'opposite': opposite}
    return streams, q, k, module.head_dims**-0.5, kv_grid


def layer_statistics(record: AttentionRecord, max_queries: Optional[int] = 1024) -> LayerStatistics:
    """Entropies (each stream and softmax over the same q, k), negative mass and kernel scales of
    one recorded layer, averaged over at most ``max_queries`` evenly spread queries and the batch.
    Distances exclude the pairs of a query with itself when the keys are the queries."""
    num_tokens = record.x.shape[1]
    query_index = query_subset(num_tokens, max_queries)
    streams, q, k, softmax_scale, _ = attention_streams(record, query_index)
    streams = dict(streams, softmax=softmax_rows(q, k, softmax_scale, query_index))
    entropy = {name: row_entropy(rows).mean(dim=(0, 2)).tolist() for name, rows in streams.items()}
    is_laplacian = isinstance(record.module, LaplacianAttention)
    negative = negative_mass(streams['laplacian' if is_laplacian else 'same']).mean(dim=(0, 2))
    l1, sq_l2 = pairwise_distances(q, k, query_index, exclude_self=is_laplacian)
    gaussian = is_laplacian and record.module.kernel == 'gaussian'
    scales = kernel_scales(l1, sq_l2, record.module.lam if is_laplacian else None,
                           sigma=1.0 if gaussian else None)
    return LayerStatistics('laplacian' if is_laplacian else 'polarity', k.shape[-2], entropy,
                           negative.tolist(), scales, softmax_scale, l1.flatten(), sq_l2.flatten())


def one_block_per_stage(records: Sequence[AttentionRecord],
                        block: int = -1) -> List[AttentionRecord]:
    """One record per stage: block ``block`` of each stage (Python indexing, -1 = the last)."""
    by_stage: Dict[int, List[AttentionRecord]] = {}
    for record in records:
        by_stage.setdefault(record.stage, []).append(record)
    chosen = []
    for stage in sorted(by_stage):
        blocks = by_stage[stage]
        if not -len(blocks) <= block < len(blocks):
            raise ValueError(f'block {block} does not exist in stage {stage}, which has '
                             f'{len(blocks)} blocks')
        chosen.append(blocks[block])
    return chosen
