"""Model shapes, isolation between users, config validation, determinism, component skip."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pipelines.model.config import GemConfig
from pipelines.model.embed import hash_ids
from pipelines.model.gem import GemModel, conversion_logit
from tests.model.factories import random_batch, tiny_config


def test_output_shapes_and_normalised_user_embedding() -> None:
    model = GemModel(tiny_config()).eval()
    out = model(random_batch([3, 0, 9, 17]))
    assert out.click_logit.shape == out.conversion_logit.shape == (4,)
    assert out.user_embedding.shape == out.pair_embedding.shape == (4, 8)
    torch.testing.assert_close(out.user_embedding.norm(dim=1), torch.ones(4))
    assert out.aux_loss.ndim == 0 and torch.isfinite(out.aux_loss)


def test_default_config_has_64_dim_representations_and_64_token_blocks() -> None:
    config = GemConfig()
    assert config.representation_dim == 64 and config.block_size == 64


def test_represent_returns_numpy_arrays_that_own_their_memory() -> None:
    model = GemModel(tiny_config()).eval()
    batch = random_batch([2, 5])
    reps = model.represent(batch)
    assert reps.p_click.dtype == np.float32 and reps.p_click.shape == (2,)
    assert reps.user_embedding.shape == (2, 8) and reps.user_embedding.flags.owndata
    assert np.all((reps.p_click > 0) & (reps.p_click < 1))
    assert reps.user_id.tolist() == batch.user_id.tolist() and reps.num_tokens.tolist() == [2, 5]


@pytest.mark.parametrize("skip", [True, False])
def test_perturbing_one_users_history_leaves_every_other_user_unchanged(skip: bool) -> None:
    torch.manual_seed(1)
    model = GemModel(tiny_config(component_skip=skip, num_layers=3)).eval()
    model.cpu_chunk_blocks = 2  # chunks of block attention straddle users too
    lengths = [9, 17, 8, 1, 30]
    batch = random_batch(lengths, seed=4)
    changed = random_batch(lengths, seed=4)
    lo, hi = int(batch.offsets[1]), int(batch.offsets[2])  # user 1's tokens
    changed.item_id[lo:hi] += 17
    changed.event_type[lo:hi] = (changed.event_type[lo:hi] + 3) % 12
    with torch.no_grad():
        a, b = model(batch), model(changed)
    others = torch.tensor([0, 2, 3, 4])
    for name in ("click_logit", "user_embedding", "pair_embedding"):
        torch.testing.assert_close(getattr(a, name)[others], getattr(b, name)[others], atol=1e-6, rtol=0)
    assert not torch.allclose(a.user_embedding[1], b.user_embedding[1])


def test_same_seed_same_model_and_outputs() -> None:
    outs = []
    for _ in range(2):
        torch.manual_seed(7)
        model = GemModel(tiny_config()).eval()
        with torch.no_grad():
            outs.append(model(random_batch([4, 12], seed=2)).click_logit)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize(
    "changes",
    [
        {"d_model": 10, "num_heads": 4},
        {"block_size": 0},
        {"experts": ("fm", "mlp")},
        {"top_k": 5},
        {"hash_sizes": {"item": 10}},
        {"dropout": 1.0},
        {"max_len": -1},
        {"num_layers": True},
    ],
)
def test_bad_config_is_rejected_at_construction(changes: dict) -> None:
    with pytest.raises(ValueError, match="GemConfig"):
        tiny_config(**changes)


def test_layer_plan_alternates_local_and_global_and_ends_global() -> None:
    assert GemConfig(num_layers=4).layer_plan() == [(True, False), (False, True), (True, False), (False, True)]
    assert GemConfig(num_layers=3).layer_plan() == [(True, False), (False, True), (False, True)]
    assert GemConfig(num_layers=2, component_skip=False).layer_plan() == [(True, True), (True, True)]
    assert all(not local for local, _ in GemConfig(bypass_block_attention=True).layer_plan())


def test_component_skip_saves_flops() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    batch = random_batch([40, 64, 7, 100])
    flops = {}
    for skip in (True, False):
        model = GemModel(tiny_config(component_skip=skip, num_layers=4)).eval()
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(batch)
        flops[skip] = counter.get_total_flops()
    assert flops[True] < 0.7 * flops[False]


def test_hashed_ids_stay_in_range_and_null_has_its_own_bucket() -> None:
    ids = torch.tensor([-1, 0, 1, 2**40, 2**62, -5])
    buckets = hash_ids(ids, 0x51ED27, 100)
    assert buckets[0] == 0 and buckets[-1] == 0
    assert torch.all((buckets[1:5] >= 1) & (buckets[1:5] < 100))
    assert len(set(hash_ids(torch.arange(1000), 3, 1 << 20).tolist())) > 990


def test_bf16_autocast_runs_forward_and_backward() -> None:
    """The CUDA path trains and infers under bf16 autocast; CPU autocast exercises the same dtype mixing."""
    model = GemModel(tiny_config())
    batch = random_batch([0, 3, 20, 9], with_labels=True)
    assert batch.clicked is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out.click_logit.float(), batch.clicked)
    loss.backward()
    with torch.no_grad():
        reference = model(batch)
    torch.testing.assert_close(out.click_logit.float(), reference.click_logit, atol=0.05, rtol=0.05)


def test_conversion_probability_is_click_times_conversion_after_click() -> None:
    from pipelines.model.gem import conversion_logit

    click = torch.tensor([-20.0, -3.0, 0.0, 3.0, 20.0], requires_grad=True)
    after = torch.tensor([-20.0, -2.0, 0.0, 5.0, 20.0])
    logit = conversion_logit(click, after)
    torch.testing.assert_close(torch.sigmoid(logit), torch.sigmoid(click) * torch.sigmoid(after))
    logit.sum().backward()
    assert click.grad is not None and torch.isfinite(click.grad).all()


def test_user_representation_reads_the_history_only() -> None:
    model = GemModel(tiny_config()).eval()
    batch = random_batch([4, 0, 11], seed=5)
    other = random_batch([4, 0, 11], seed=6)
    request = {
        name: getattr(other, name)
        for name in (
            "user_id",
            "request_surface",
            "device",
            "target_item",
            "target_advertiser",
            "target_category",
            "target_is_ad",
        )
    }
    moved = dataclasses.replace(batch, **request)
    with torch.no_grad():
        torch.testing.assert_close(model(batch).user_embedding, model(moved).user_embedding)


def test_heads_read_only_the_pair_representation_and_the_surface() -> None:
    model = GemModel(tiny_config()).eval()
    batch = random_batch([3, 8, 1], seed=2)
    with torch.no_grad():
        out = model(batch)
        click, _ = model.heads(out.pair_embedding, batch.request_surface)
    torch.testing.assert_close(click, out.click_logit)


def test_interest_loss_teaches_the_user_representation_the_categories_a_user_sees() -> None:
    torch.manual_seed(0)
    model = GemModel(tiny_config())
    batch = random_batch([6] * 16, seed=1)
    owner = torch.repeat_interleave(torch.arange(16), batch.lengths)
    favourite = torch.arange(16) % 4  # each user's history and next impression share one category
    batch = dataclasses.replace(batch, category=favourite[owner], target_category=favourite)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = model.interest_loss(model(batch).user_embedding, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    nothing = dataclasses.replace(random_batch([0] * 16, seed=1), target_category=torch.full_like(favourite, -1))
    assert model.interest_loss(model(nothing).user_embedding, nothing).item() == 0.0


def test_esmm_conversion_logit_is_the_logit_of_the_product_with_finite_gradients() -> None:
    click = torch.tensor([-30.0, -8.0, -1.0, 0.0, 0.5, 3.0, 12.0, 25.0], dtype=torch.float64, requires_grad=True)
    after = torch.tensor([-20.0, 2.0, -0.3, 0.0, 9.0, -4.0, 12.0, 30.0], dtype=torch.float64, requires_grad=True)
    got = conversion_logit(click, after)
    p = torch.sigmoid(click.detach()) * torch.sigmoid(after.detach())
    torch.testing.assert_close(torch.sigmoid(got.detach()), p.float(), rtol=1e-4, atol=1e-12)
    assert bool((got.detach() <= torch.minimum(click, after).detach() + 1e-4).all())  # p <= each factor
    got.sum().backward()
    assert click.grad is not None and after.grad is not None
    assert bool(torch.isfinite(click.grad).all() and torch.isfinite(after.grad).all())


def test_esmm_model_starts_at_the_base_rates() -> None:
    model = GemModel(tiny_config(esmm=True)).eval()
    model.init_output_bias(0.02, 0.001)
    with torch.no_grad():
        head = model.task_mlp[-1]
        assert isinstance(head, torch.nn.Linear)
        head.weight.zero_()  # the heads read only their bias
        out = model(random_batch([3, 5]))
    torch.testing.assert_close(torch.sigmoid(out.click_logit), torch.full((2,), 0.02))
    torch.testing.assert_close(torch.sigmoid(out.conversion_logit), torch.full((2,), 0.001), rtol=1e-3, atol=1e-6)
