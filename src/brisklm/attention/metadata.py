"""The explicit per-forward description of where each token sits and which keys it sees."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Where the N tokens of one forward pass go: B rows packed back to back, no padding.

    Row b appends ``query_lens[b]`` tokens to cache slot ``slot_list[b]`` starting at position
    ``start_positions[b]``. Linear layers run on the packed (N, ...) tokens; attention, which needs
    rows, views them as (B, T, ...) when every row has the same length and otherwise scatters them
    into a padded (B, T_max, ...) buffer (``pad_index``). Host-side lists drive the fast-path
    decisions; device tensors drive the kernels.
    """

    slots: torch.Tensor  # (B,) int64
    token_slots: torch.Tensor  # (N,) int64 cache slot of each token
    positions: torch.Tensor  # (N,) int64 absolute position of each token
    start_positions: list[int]
    query_lens: list[int]
    slot_list: list[int]
    # Ragged batches only: flat index of each token in the padded (B * T_max) layout, and the
    # positions of that layout (padding queries sit at position 0, where key 0 is always visible).
    pad_index: torch.Tensor | None = None  # (N,) int64
    padded_positions: torch.Tensor | None = None  # (B, T_max) int64
    # Rows must come out exactly as computed alone (see ForwardBatch.row_invariant).
    row_invariant: bool = False
    # Per row, whether each of its queries must come out exactly as a one-token decode step at its
    # position computes it (generated tokens fed several at once: a verification row, a run of
    # grammar-forced tokens; brisklm.engine.model_runner.decode_rows_stepwise). None: no such row.
    stepwise: tuple[bool, ...] | None = None
    # Backend-private values computed once per forward (masks per window size, ...).
    cache: dict[object, object] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

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
    def is_ragged(self) -> bool:
        return self.pad_index is not None

    @property
    def slot_range(self) -> tuple[int, int] | None:
        """(first, last + 1) when the rows are consecutive slots, so the cache can be sliced, not gathered."""
        first = self.slot_list[0]
        if self.slot_list == list(range(first, first + len(self.slot_list))):
            return first, first + len(self.slot_list)
        return None

    @property
    def is_uniform(self) -> bool:
        """Every row adds the same number of tokens at the same position (one mask fits all)."""
        return len(set(self.query_lens)) == 1 and len(set(self.start_positions)) == 1

    @classmethod
    def build(
        cls,
        slots: list[int],
        start_positions: list[int],
        query_lens: list[int],
        device: torch.device | str,
        row_invariant: bool = False,
        stepwise: list[bool] | tuple[bool, ...] | None = None,
    ) -> AttentionMetadata:
        positions = [
            p for start, n in zip(start_positions, query_lens) for p in range(start, start + n)
        ]
        token_slots = [slot for slot, n in zip(slots, query_lens) for _ in range(n)]
        pad_index = padded_positions = None
        max_len = max(query_lens)
        if any(n != max_len for n in query_lens):
            pad_index = torch.tensor(
                [row * max_len + t for row, n in enumerate(query_lens) for t in range(n)],
                dtype=torch.int64,
            ).to(device)
            padded = [
                list(range(start, start + n)) + [0] * (max_len - n)
                for start, n in zip(start_positions, query_lens)
            ]
            padded_positions = torch.tensor(padded, dtype=torch.int64).to(device)
        return cls(
            slots=torch.tensor(slots, dtype=torch.int64).to(device),
            token_slots=torch.tensor(token_slots, dtype=torch.int64).to(device),
            positions=torch.tensor(positions, dtype=torch.int64).to(device),
            start_positions=list(start_positions),
            query_lens=list(query_lens),
            slot_list=list(slots),
            pad_index=pad_index,
            padded_positions=padded_positions,
            row_invariant=row_invariant,
            stepwise=_rows_of_several_queries(stepwise, query_lens),
        )

    def rows(self) -> list[AttentionMetadata]:
        """One single-row metadata per row (built once per forward pass, shared by the layers)."""
        rows = self.cache.get("rows")
        if rows is None:
            rows = [
                AttentionMetadata.build([slot], [start], [length], self.positions.device)
                for slot, start, length in zip(
                    self.slot_list, self.start_positions, self.query_lens
                )
            ]
            self.cache["rows"] = rows
        return rows  # type: ignore[return-value]

    def split_single_token_rows(
        self,
    ) -> list[tuple[AttentionMetadata, slice | torch.Tensor]] | None:
        """A batch mixing one-token rows (decoding requests) with longer ones (prompt chunks) as
        those two groups: each group's metadata and where its tokens sit in the packed layout (a
        slice when they are contiguous). None for any other batch.

        Attention over the ragged whole would pad every one-token row to the longest row: with a
        512-token chunk beside eight decoding rows, 4,096 padded queries for 520 real ones.
        """
        if "split" not in self.cache:
            single = [b for b, n in enumerate(self.query_lens) if n == 1]
            parts = None
            if single and len(single) < self.batch_size:
                chosen = set(single)
                longer = [b for b in range(self.batch_size) if b not in chosen]
                ranges = self.row_token_ranges()
                device = self.positions.device
                parts = []
                for rows in (single, longer):
                    tokens = [t for b in rows for t in range(*ranges[b])]
                    index: slice | torch.Tensor = slice(tokens[0], tokens[-1] + 1)
                    if len(tokens) != tokens[-1] + 1 - tokens[0]:
                        index = torch.tensor(tokens, dtype=torch.int64).to(device)
                    sub = AttentionMetadata.build(
                        [self.slot_list[b] for b in rows],
                        [self.start_positions[b] for b in rows],
                        [self.query_lens[b] for b in rows],
                        device,
                        self.row_invariant,
                        None if self.stepwise is None else [self.stepwise[b] for b in rows],
                    )
                    parts.append((sub, index))
            self.cache["split"] = parts
        return self.cache["split"]  # type: ignore[return-value]

    def row_token_ranges(self) -> list[tuple[int, int]]:
        """(start, end) of each row's tokens in the packed (N, ...) layout."""
        ranges, start = [], 0
        for length in self.query_lens:
            ranges.append((start, start + length))
            start += length
        return ranges

    def row_positions(self) -> torch.Tensor:
        """(B, T) positions of the row layout attention works in (padded when ragged)."""
        if self.padded_positions is not None:
            return self.padded_positions
        return self.positions.view(self.batch_size, self.max_query_len)

    def to_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Packed (N, ...) -> rows (B, T, ...); padding entries are zero."""
        batch, max_len = self.batch_size, self.max_query_len
        if self.pad_index is None:
            return x.view(batch, max_len, *x.shape[1:])
        rows = x.new_zeros(batch * max_len, *x.shape[1:])
        rows.index_copy_(0, self.pad_index, x)
        return rows.view(batch, max_len, *x.shape[1:])

    def to_packed(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows (B, T, ...) -> packed (N, ...), dropping padding."""
        flat = rows.reshape(rows.shape[0] * rows.shape[1], *rows.shape[2:])
        return flat if self.pad_index is None else flat.index_select(0, self.pad_index)

    def allowed_keys(self, num_keys: int, sliding_window: int | None) -> torch.Tensor:
        """Boolean (B, 1, T, S) mask: a query at position p sees keys j with p - window < j <= p."""
        key = ("allowed", num_keys, sliding_window)
        mask = self.cache.get(key)
        if mask is None:
            positions = self.row_positions()
            keys = torch.arange(num_keys, device=positions.device)
            query_pos = positions[:, :, None]
            mask = keys[None, None, :] <= query_pos
            if sliding_window is not None:
                mask &= keys[None, None, :] > query_pos - sliding_window
            mask = mask[:, None]
            self.cache[key] = mask
        return mask  # type: ignore[return-value]


def _rows_of_several_queries(
    stepwise: list[bool] | tuple[bool, ...] | None, query_lens: list[int]
) -> tuple[bool, ...] | None:
    """The stepwise flags that matter: a one-token row is a decode step already."""
    if stepwise is None:
        return None
    if len(stepwise) != len(query_lens):
        raise ValueError("stepwise flags need one entry per row")
    flags = tuple(bool(s) and n > 1 for s, n in zip(stepwise, query_lens))
    return flags if any(flags) else None
