"""The explicit per-forward description of where each row's queries sit and which keys they see."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Positions and cache rows of one forward pass over B rows of up to T new tokens each.

    Row b appends ``query_lens[b]`` tokens to cache slot ``slots[b]`` starting at position
    ``start_positions[b]``; shorter rows are right-padded to T. Host-side lists drive the Python
    fast-path decisions; device tensors drive the kernels.
    """

    slots: torch.Tensor  # (B,) int64
    positions: torch.Tensor  # (B, T) int64 rotary positions; padding queries sit at 0
    write_positions: (
        torch.Tensor
    )  # (B, T) int64 cache columns; padding writes to the scratch column
    start_positions: list[int]
    query_lens: list[int]
    slot_list: list[int]
    # Backend-private values computed once per forward (masks per window size, ...).
    cache: dict[object, object] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return int(self.positions.shape[1])

    @property
    def kv_lens(self) -> list[int]:
        return [s + q for s, q in zip(self.start_positions, self.query_lens)]

    @property
    def max_kv_len(self) -> int:
        return max(self.kv_lens)

    @property
    def row_max_positions(self) -> list[int]:
        return [n - 1 for n in self.kv_lens]

    @property
    def slot_range(self) -> tuple[int, int] | None:
        """(first, last + 1) when the rows are consecutive slots, so the cache can be sliced, not gathered."""
        first = self.slot_list[0]
        if self.slot_list == list(range(first, first + len(self.slot_list))):
            return first, first + len(self.slot_list)
        return None

    @property
    def is_uniform(self) -> bool:
        """Every row adds the same number of tokens at the same position (no padding, one mask for all)."""
        return len(set(self.query_lens)) == 1 and len(set(self.start_positions)) == 1

    @classmethod
    def build(
        cls,
        slots: list[int],
        start_positions: list[int],
        query_lens: list[int],
        scratch_position: int,
        device: torch.device | str,
    ) -> AttentionMetadata:
        num_rows = len(slots)
        max_len = max(query_lens)
        if num_rows == 1 or len(set(query_lens)) == 1:
            offsets = torch.arange(max_len, dtype=torch.int64)
            positions = torch.tensor(start_positions, dtype=torch.int64)[:, None] + offsets[None, :]
            write_positions = positions
        else:
            rows = []
            writes = []
            for start, length in zip(start_positions, query_lens):
                pad = max_len - length
                rows.append(list(range(start, start + length)) + [0] * pad)
                writes.append(list(range(start, start + length)) + [scratch_position] * pad)
            positions = torch.tensor(rows, dtype=torch.int64)
            write_positions = torch.tensor(writes, dtype=torch.int64)
        positions = positions.to(device)
        return cls(
            slots=torch.tensor(slots, dtype=torch.int64, device=device),
            positions=positions,
            write_positions=write_positions.to(device)
            if write_positions is not positions
            else positions,
            start_positions=list(start_positions),
            query_lens=list(query_lens),
            slot_list=list(slots),
        )

    def allowed_keys(self, num_keys: int, sliding_window: int | None) -> torch.Tensor:
        """Boolean (B, 1, T, S) mask: query at position p sees keys j with p - window < j <= p."""
        key = ("allowed", num_keys, sliding_window)
        mask = self.cache.get(key)
        if mask is None:
            keys = torch.arange(num_keys, device=self.positions.device)
            query_pos = self.positions[:, :, None]
            mask = keys[None, None, :] <= query_pos
            if sliding_window is not None:
                mask &= keys[None, None, :] > query_pos - sliding_window
            mask = mask[:, None]
            self.cache[key] = mask
        return mask  # type: ignore[return-value]
