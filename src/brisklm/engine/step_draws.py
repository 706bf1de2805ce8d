"""The uniforms of several sampled decode steps, drawn ahead for one native call
(``NativeForward.run_steps``), and the generators put back where fewer steps ran."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from brisklm.models.native_forward import StepSampling
from brisklm.sampling import SamplingMetadata


def step_uniforms(md: SamplingMetadata, steps: int, rows: int) -> torch.Tensor:
    """(steps, rows) float64: the uniforms ``row_uniforms`` gives ``md``'s rows at each of
    ``steps`` sampled steps in turn. The default generator's rows take each step's draws in one
    batch, step after step (one call draws what the calls of the steps would), each seeded row its
    own generator's next ``steps``; greedy rows draw nothing and get 0.5."""
    out = torch.full((steps, rows), 0.5, dtype=torch.float64)
    default = md.default_rng_rows
    if default is None:  # every row draws from the default generator
        out.copy_(torch.rand(steps * rows, dtype=torch.float64).view(steps, rows))
    elif len(default):
        index = default.tolist()
        out[:, index] = torch.rand(steps * len(index), dtype=torch.float64).view(steps, -1)
    for row, generator in md.generators.items():
        out[:, row] = torch.rand(steps, dtype=torch.float64, generator=generator)
    return out


@dataclass
class StepDraws:
    """A call's ``StepSampling`` and the generators' states before its draws."""

    sampling: StepSampling
    md: SamplingMetadata
    rows: int
    default_state: torch.Tensor | None
    row_states: dict[int, torch.Tensor]

    @classmethod
    def draw(cls, md: SamplingMetadata, steps: int, rows: int) -> StepDraws:
        """The draws of ``steps`` sampled steps of ``md``'s rows (not all greedy)."""
        default = md.default_rng_rows
        default_state = torch.get_rng_state() if default is None or len(default) else None
        row_states = {row: g.get_state() for row, g in md.generators.items()}
        uniforms = step_uniforms(md, steps, rows)
        if md.is_greedy is None:
            sampled = torch.ones(rows, dtype=torch.bool)
        else:
            sampled = ~md.is_greedy.cpu()
        return cls(
            StepSampling(uniforms, sampled, md.filter_rows), md, rows, default_state, row_states
        )

    def rewind(self, steps: int) -> None:
        """Leave the generators as ``steps`` sampled steps would have (fewer ran than drawn for:
        a row had nothing to draw)."""
        if self.default_state is not None:
            torch.set_rng_state(self.default_state)
        for row, state in self.row_states.items():
            self.md.generators[row].set_state(state)
        if steps:
            step_uniforms(self.md, steps, self.rows)
