"""Exact quantiles by radix selection: two histogram passes over 16-bit halves of the float key.

Why not ``torch.quantile``: it sorts (slow), refuses inputs over 16M elements, and cannot run over
values spread across micro-batches and data-parallel ranks without gathering them all.

How: a float32 is mapped to an order-preserving 32-bit integer key. A first histogram over the
key's top 16 bits (65,536 bins) tells which bin holds the wanted order statistic; a second
histogram over the low 16 bits of that bin's members gives the exact key, hence the exact value.
Histograms of different chunks add up, so the same two passes work over many micro-batches, and
over ranks by all-reducing the 65,536-bin count vectors (512 KiB of int64 for the first pass and
512 KiB per order statistic for the second, whatever the number of tokens). Counts are int64, so
there is no size limit. Populations of at most 8,192 values are simply gathered (at most 32 KiB
over all ranks) and sorted.

Communication per quantile over ``comm``: one int64 all-reduce for the size, then either one
all-gather of the members (at most 8,192 float32 in all) or the radix passes above: one
65,536-bin int64 all-reduce (512 KiB) for the high halves, and one more per distinct high bin
that a wanted order statistic falls in (a quantile needs one or two; adjacent order statistics
usually share a bin). On the device path (below) a quantile's two neighbours share one second pass
and one all-reduce of twice the bins. The volume does not grow with the number of tokens.

Approximate mode (``mode="histogram"``), for very large steps: only the first pass. The order
statistic is placed inside its high bin by linear interpolation on its rank within the bin, which
saves the second pass over every value and its all-reduce. A high bin fixes the sign, the
exponent and the top 7 mantissa bits of a float32, so the result and the exact order statistic
lie in the same bin, whose width is less than ``2**-7`` times the magnitude of any value in it:
the absolute error is below ``max(|x| / 128, 2**-133)`` (0.78%; the second term is the width of
the bins of subnormal numbers, around zero), where ``x`` is the exact order statistic (for
``linear``/``midpoint``, the larger in magnitude of the two it interpolates). Populations of at
most ``SORT_LIMIT`` values stay exact.

The result is ``torch.quantile(values, q, interpolation=...)``'s definition (the order statistics
around the position ``q * (n - 1)``), with the position computed in float64: torch computes it in
the input's dtype, so for float32 input its "higher"/"nearest" can pick a neighbouring order
statistic and its "linear" weight is off by float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlstab.comm import Comm
from rlstab.lazy import torch

INTERPOLATIONS = ("linear", "lower", "higher", "nearest", "midpoint")
MODES = ("exact", "histogram")

_BINS = 1 << 16

def _sortable_key(values: torch.Tensor) -> torch.Tensor:
    """int32 keys ordered like the float32 values (IEEE sign-magnitude -> two's complement)."""
    bits = values.contiguous().view(torch.int32)
    return (bits >> 31).bitwise_and_(0x7FFFFFFF).bitwise_xor_(bits)


def _key_to_value(key: int | torch.Tensor) -> torch.Tensor:
    """The float32 value of a sortable key: a Python int (a CPU tensor), or an int64 tensor of them, 0-d or 1-d
    (on its device)."""
    if isinstance(key, torch.Tensor):
        shape = key.shape
        key = key.to(torch.int32).reshape(-1) if not shape else key.to(torch.int32)
        values = (key ^ ((key >> 31) & 0x7FFFFFFF)).view(torch.float32)
        return values[0] if not shape else values
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32)[0]


class Population:
    """Values on which a quantile is taken, given as chunks ``(values, include)``.

    ``values`` is any float tensor, ``include`` a bool tensor of the same shape selecting the
    members. Chunks are typically micro-batches; ``comm`` spans data-parallel ranks. Populations of
    at most ``SORT_LIMIT`` members are gathered and sorted (cheaper than two histograms at that
    size); larger ones use the radix selection.

    Host reads. The population's size is read once (one synchronisation with a GPU): a quantile's
    rank depends on it. Everything else stays on the device, on any device but the CPU
    (``ON_DEVICE``): the members of a small population are taken by ``topk`` (at most
    ``SORT_LIMIT`` per chunk) instead of a boolean index, the histograms are ``scatter_add``
    (``bincount`` reads its input's maximum), and the radix selection's bins are found by
    ``searchsorted`` on 0-d tensors. On the CPU, where a read costs nothing, the host path
    (boolean index, ``bincount``, bins as Python ints) is faster, and gives the same values.
    Across ranks, a small population's members are gathered as on the CPU (boolean index; the
    gather exchanges their counts, a read anyway), so that at most ``SORT_LIMIT`` values travel.
    """

    SORT_LIMIT = 8192  # measured on CPU: sorting wins below ~8k values, radix above
    ON_DEVICE: bool | None = None  # selection on the device (True), bins read on the host (False), None: by the values' device

    def __init__(self, chunks: Sequence[tuple[torch.Tensor, torch.Tensor]], comm: Comm | None = None):
        comm = comm or Comm(distributed=False)
        self._reduce = comm.sum
        self._device = chunks[0][0].device if chunks else torch.device("cpu")
        self._on_device = self._device.type != "cpu" if self.ON_DEVICE is None else self.ON_DEVICE
        values = [(v.detach() if v.requires_grad else v).to(torch.float32).reshape(-1) for v, _ in chunks]
        include = [inc.reshape(-1) for _, inc in chunks]
        local = torch.zeros((), dtype=torch.int64, device=self._device) if not include else None
        for inc in include:
            local = torch.count_nonzero(inc) if local is None else local + torch.count_nonzero(inc)
        self.size = int(comm.sum(local))  # host sync: the size fixes the quantile's rank
        self._sorted = None
        if self.size <= self.SORT_LIMIT:
            if self._on_device and not comm.distributed:  # every member, and +inf after them: no size read per chunk
                members = [torch.where(inc, v, math.inf).topk(min(self.size, v.numel()), largest=False).values
                           for v, inc in zip(values, include)]
            else:
                members = [v[inc] for v, inc in zip(values, include)]
            gathered = comm.cat(torch.cat(members) if members else torch.zeros(0, device=self._device))
            self._sorted = gathered.sort().values
            return
        # Per chunk: the sortable key, and 1 + the high bin of each member, 0 for non-members
        # (a multiply: masked_fill and where are several times slower on CPU).
        self._chunks = []
        high = None
        for v, inc in zip(values, include):
            key = _sortable_key(v)
            high_bin = (key >> 16).add_(_BINS // 2 + 1).mul_(inc.to(torch.int32))
            counts = self._histogram(high_bin, _BINS + 1)[1:]
            high = counts if high is None else high + counts
            self._chunks.append((key, high_bin))
        self._cum_high = torch.cumsum(self._reduce(high), 0)
        if self._on_device:  # members below each high bin: [0, cum_high...], read at a bin by one index_select
            self._below_high = torch.nn.functional.pad(self._cum_high, (1, 0))
        self._cum_low: dict[int, torch.Tensor] = {}  # high bin -> cumulative low histogram of its members

    def _histogram(self, bins: torch.Tensor, size: int, weights: torch.Tensor | None = None) -> torch.Tensor:
        """int64 counts of ``bins`` (values in ``[0, size)``), each counted with its 0/1 weight."""
        if not self._on_device and weights is None:
            return torch.bincount(bins, minlength=size)
        counts = torch.zeros(size, dtype=torch.int64, device=bins.device)
        return counts.scatter_add_(0, bins.to(torch.int64), torch.ones_like(bins, dtype=torch.int64) if weights is None else weights)

    def order_statistic(self, k: int, mode: str = "exact") -> torch.Tensor:
        """The k-th smallest member (0-based) as a float32 0-d tensor: exactly, or within its
        high bin (``mode="histogram"``, see the module docstring for the error bound)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not 0 <= k < self.size:
            raise IndexError(f"order statistic {k} out of range for {self.size} values")
        if self._sorted is not None:
            return self._sorted[k]
        if self._on_device:
            return self._order_statistics_on_device(k, 1, mode)[0]
        target = torch.tensor(k, dtype=torch.int64, device=self._device)
        hi_bin = int(torch.searchsorted(self._cum_high, target, right=True))
        below = int(self._cum_high[hi_bin - 1]) if hi_bin > 0 else 0
        if mode == "histogram":
            return self._within_bin(hi_bin, k - below, int(self._cum_high[hi_bin]) - below)
        cum_low = self._cum_low.get(hi_bin)
        if cum_low is None:  # adjacent order statistics usually share a bin: one pass for both
            low = torch.zeros(_BINS, dtype=torch.int64, device=self._device)
            for key, high_bin in self._chunks:
                members = key[high_bin == hi_bin + 1]  # few elements: compact before the histogram
                low += torch.bincount((members & 0xFFFF).to(torch.int64), minlength=_BINS)
            cum_low = self._cum_low[hi_bin] = torch.cumsum(self._reduce(low), 0)
        lo_bin = int(torch.searchsorted(cum_low, target - below, right=True))
        key = ((hi_bin - _BINS // 2) << 16) | lo_bin
        return _key_to_value(key).to(self._device)

    def _order_statistics_on_device(self, k: int, count: int, mode: str) -> torch.Tensor:
        """Order statistics ``k`` to ``k + count - 1`` (``count`` 1 or 2: a quantile's neighbours) as a float32
        ``[count]`` tensor, with the bins as device tensors: no host read. The second pass weighs every value
        by its membership of the bin instead of compacting the members, and takes both order statistics'
        bins at once (one histogram of twice the bins: the first's members, then the second's when its bin
        differs; it usually does not)."""
        target = torch.arange(k, k + count, device=self._device)
        hi_bin = torch.searchsorted(self._cum_high, target, right=True)  # < _BINS: every k is below the size
        below = self._below_high.index_select(0, hi_bin)
        first = (hi_bin - _BINS // 2) << 16  # each bin's smallest key
        if mode == "histogram":
            in_bin = self._below_high.index_select(0, hi_bin + 1) - below
            ends = _key_to_value(first), _key_to_value(first | 0xFFFF)
            fraction = ((target - below).to(torch.float64) + 0.5) / in_bin.to(torch.float64)
            return (ends[0].to(torch.float64) + fraction * (ends[1].to(torch.float64) - ends[0].to(torch.float64))).to(torch.float32)
        low = None
        bins = hi_bin + 1  # as ``high_bin`` numbers them
        for key, high_bin in self._chunks:
            member = high_bin == bins[0]
            index = (key & 0xFFFF).to(torch.int64)
            if count == 2:
                second = (high_bin == bins[1]).logical_and_(~member)  # empty when both are in one bin
                index += second * _BINS
                member.logical_or_(second)
            counts = self._histogram(index, count * _BINS, member.to(torch.int64))
            low = counts if low is None else low + counts
        cum_low = torch.cumsum(self._reduce(low).view(count, _BINS), -1)
        if count == 2:  # one bin: its histogram is the first's
            cum_low = torch.where(hi_bin[1] == hi_bin[0], cum_low[0], cum_low)
        lo_bin = torch.searchsorted(cum_low, (target - below).unsqueeze(-1), right=True).view(count)
        return _key_to_value(first | lo_bin)

    def _within_bin(self, hi_bin: int, rank: int, count: int) -> torch.Tensor:
        """The rank-th of ``count`` members of a high bin, placed linearly between the bin's ends.

        Within a bin the exponent is fixed, so the key and the value are affine in each other and
        interpolating values is interpolating keys. Member ``r`` of ``c`` sits at ``(r + 0.5) / c``.
        """
        first = (hi_bin - _BINS // 2) << 16
        ends = [float(_key_to_value(first)), float(_key_to_value(first | 0xFFFF))]
        value = ends[0] + (rank + 0.5) / count * (ends[1] - ends[0])
        return torch.tensor(value, dtype=torch.float32, device=self._device)

    def quantile(self, q: float, interpolation: str = "linear", mode: str = "exact") -> torch.Tensor | None:
        """The q-quantile of the members, or None when there are none.

        ``mode="histogram"``: approximate, from the first histogram pass alone (error bound in
        the module docstring); ``"exact"``: the exact value.
        """
        if self.size == 0:
            return None
        pos = q * (self.size - 1)
        lo_rank, hi_rank = math.floor(pos), math.ceil(pos)
        frac = pos - lo_rank
        if interpolation == "lower" or frac == 0.0:
            return self.order_statistic(lo_rank, mode)
        if interpolation == "higher":
            return self.order_statistic(hi_rank, mode)
        if interpolation == "nearest":
            # torch.quantile rounds half to even on the position.
            return self.order_statistic(int(round(pos)), mode)
        if self._sorted is None and self._on_device:  # neighbours: both in one pass
            lo, hi = self._order_statistics_on_device(lo_rank, 2, mode).unbind()
        else:
            lo, hi = self.order_statistic(lo_rank, mode), self.order_statistic(hi_rank, mode)
        if interpolation == "midpoint":
            return torch.lerp(lo, hi, 0.5)
        return torch.lerp(lo, hi, torch.full((), frac, dtype=torch.float32, device=lo.device))


def quantile(
    values: torch.Tensor,
    q: float,
    include: torch.Tensor | None = None,
    interpolation: str = "linear",
    mode: str = "exact",
) -> torch.Tensor | None:
    """q-quantile of ``values[include]`` (all values when ``include`` is None): exact, or
    approximate within ``max(|x| / 128, 2**-133)`` with ``mode="histogram"``."""
    if include is None:
        include = torch.ones_like(values, dtype=torch.bool)
    return Population([(values, include)]).quantile(q, interpolation, mode)
