"""train.py's loss: weighted cross entropy; with a teacher, (1 - w) x that + w x KL(teacher ||
student); with ``distill_where_teacher_right``, the KL term only where the teacher's top token is
the label. Checked against a per-position reference written out with plain torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.model import Shape, TrainLlama
from training.train import make_loss_fn

SHAPE = Shape(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    vocab_size=16,
)


def models(seed: int) -> tuple[TrainLlama, TrainLlama]:
    torch.manual_seed(seed)
    student, teacher = TrainLlama(SHAPE), TrainLlama(SHAPE)
    for model in (student, teacher):
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.5)  # spread-out logits: both models disagree somewhere
    return student, teacher.eval().requires_grad_(False)


def batch(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, SHAPE.vocab_size, (2, 12), generator=g)
    weights = torch.rand(2, 12, generator=g) * (torch.rand(2, 12, generator=g) > 0.2)
    pos = torch.arange(12).repeat(2, 1)
    doc = torch.zeros(2, 12, dtype=torch.long)
    return ids, weights, pos, doc


def reference(student, teacher, ids, weights, pos, doc, w: float, where_right: bool):
    """The loss position by position, as the docstring of make_loss_fn states it."""
    with torch.no_grad():
        s_logp = F.log_softmax(student.lm_head(student.hidden(ids, pos, doc)), -1)
        t_logp = F.log_softmax(teacher.lm_head(teacher.hidden(ids, pos, doc)), -1)
    total, denom, right_count = 0.0, 0.0, 0
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1] - 1):
            label, weight = int(ids[b, t + 1]), float(weights[b, t + 1])
            ce = -float(s_logp[b, t, label])
            kl = float((t_logp[b, t].exp() * (t_logp[b, t] - s_logp[b, t])).sum())
            right = int(t_logp[b, t].argmax()) == label
            right_count += right
            mixed = (1 - w) * ce + w * kl
            total += weight * (mixed if right or not where_right else ce)
            denom += weight
    return total / max(denom, 1.0), right_count


def test_plain_cross_entropy_and_distillation_match_the_reference() -> None:
    student, teacher = models(0)
    ids, weights, pos, doc = batch(1)
    ce_only, _ = make_loss_fn(student, None, 0.7)(ids, weights, pos, doc)
    expected_ce, _ = reference(student, teacher, ids, weights, pos, doc, 0.0, False)
    assert abs(ce_only.item() - expected_ce) < 1e-4
    mixed, ce = make_loss_fn(student, teacher, 0.7)(ids, weights, pos, doc)
    expected_mixed, _ = reference(student, teacher, ids, weights, pos, doc, 0.7, False)
    assert abs(mixed.item() - expected_mixed) < 1e-4
    assert abs(ce.item() - expected_ce) < 1e-4  # the reported loss is the cross entropy


def test_kl_only_where_the_teacher_is_right() -> None:
    student, teacher = models(2)
    ids, weights, pos, doc = batch(3)
    # Make the teacher right at some positions: the labels there are its own top tokens.
    with torch.no_grad():
        top = teacher.lm_head(teacher.hidden(ids, pos, doc)).argmax(-1)
    ids = ids.clone()
    ids[:, 1::2] = top[:, 0:-1:2]  # labels at odd positions follow the teacher, from one before
    loss, _ = make_loss_fn(student, teacher, 0.7, True)(ids, weights, pos, doc)
    expected, right = reference(student, teacher, ids, weights, pos, doc, 0.7, True)
    assert 0 < right < 2 * (ids.shape[1] - 1)  # both kinds of position are present
    assert abs(loss.item() - expected) < 1e-4
    everywhere, _ = reference(student, teacher, ids, weights, pos, doc, 0.7, False)
    assert abs(expected - everywhere) > 1e-3  # the selection changes the loss
    # Gradients flow through both terms.
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())


def test_a_student_equal_to_its_teacher_has_only_the_cross_entropy_where_the_teacher_errs() -> None:
    student, teacher = models(4)
    teacher.load_state_dict(student.state_dict())
    ids, weights, pos, doc = batch(5)
    loss, ce = make_loss_fn(student, teacher, 0.5, True)(ids, weights, pos, doc)
    expected, _ = reference(student, teacher, ids, weights, pos, doc, 0.5, True)
    assert abs(loss.item() - expected) < 1e-4
    assert loss.item() < ce.item()  # KL is 0: where right, the loss is half the cross entropy
