import pytest
import torch
from torch.utils.data import DistributedSampler

from dpstudy.engine.loaders import (
    DeviceLoader,
    Partition,
    TorchLoader,
    affine_params,
    crop_flip_params,
    epoch_indices,
    eval_indices,
    random_affine,
    random_crop_flip,
)

N = 96
IMAGES = torch.randint(0, 256, (N, 3, 8, 8), dtype=torch.uint8)
LABELS = torch.arange(N) % 10
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]


def loader(kind, partition, train=True, augment="none", batch=16):
    common = dict(
        batch=batch,
        partition=partition,
        seed=3,
        augment=augment,
        mean=MEAN,
        std=STD,
        device=torch.device("cpu"),
        train=train,
        channels_last=False,
    )
    if kind == "torch":
        return TorchLoader(IMAGES, LABELS, workers=0, **common)
    return DeviceLoader(IMAGES, LABELS, **common)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_epoch_shards_are_disjoint_and_complete(world):
    shards = [epoch_indices(N, Partition(r, world), seed=3, epoch=1) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # every rank takes the same number of steps
    together = torch.cat(shards)
    assert len(together) == N and set(together.tolist()) == set(range(N))
    assert not torch.equal(shards[0], epoch_indices(N, Partition(0, world), seed=3, epoch=2))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_shards_match_distributed_sampler(world):
    for rank in range(world):
        sampler = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True, seed=3)
        sampler.set_epoch(5)
        assert list(sampler) == epoch_indices(N, Partition(rank, world), seed=3, epoch=5).tolist()


def test_eval_shards_cover_the_test_set_once_without_padding():
    shards = [eval_indices(10, Partition(r, 4)) for r in range(4)]
    assert sorted(torch.cat(shards).tolist()) == list(range(10))


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("world", [1, 2])
def test_torch_and_device_loaders_give_the_same_batches(world, train):
    for rank in range(world):
        a, b = loader("torch", Partition(rank, world), train), loader("device", Partition(rank, world), train)
        a.set_epoch(2), b.set_epoch(2)
        batches_a, batches_b = list(a), list(b)
        assert len(batches_a) == len(batches_b) == len(a) == len(b)
        for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
            assert xa.shape == xb.shape and xa.dtype == xb.dtype == torch.float32
            torch.testing.assert_close(xa, xb)
            assert torch.equal(ya, yb)


def test_device_loader_normalises_with_the_dataset_statistics():
    x, y = next(iter(loader("device", Partition(0, 1), train=False, batch=N)))
    expected = (IMAGES.float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(x, expected)
    assert torch.equal(y, LABELS)


def test_affine_grid_matches_torch_and_moves_almost_every_sample():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, 16, 16)
    theta = affine_params(64, g, torch.device("cpu"))
    grid = torch.nn.functional.affine_grid(theta, [64, 1, 16, 16], align_corners=False)
    expected = torch.nn.functional.grid_sample(x, grid, mode="nearest", align_corners=False)
    out = random_affine(x, theta)
    assert (out != expected).float().mean() < 1e-3  # same grid up to rounding at pixel borders
    assert (out != x).flatten(1).any(1).float().mean() > 0.9
    assert out.max() <= 1 and out.min() >= 0  # zero fill, never new values


def test_affine_parameters_follow_source_002():
    theta = affine_params(20000, torch.Generator().manual_seed(1), torch.device("cpu"))
    linear = theta[:, :, :2]
    scale = 1 / linear.det().sqrt()  # inverse matrices: det = 1 / scale^2
    angle = torch.rad2deg(torch.atan2(linear[:, 0, 1], linear[:, 0, 0]))
    assert 0.8 <= scale.min() and scale.max() <= 1.2 and scale.max() > 1.19
    assert angle.abs().max() <= 15.0001 and angle.abs().max() > 14.9


def test_crop_flip_is_a_shifted_possibly_flipped_copy():
    x = torch.arange(2 * 8 * 8, dtype=torch.float32).view(2, 1, 8, 8) + 1
    out = random_crop_flip(x, crop_flip_params(2, torch.Generator().manual_seed(1), torch.device("cpu")))
    for i in range(2):
        padded = torch.nn.functional.pad(x[i], (4, 4, 4, 4))
        candidates = [padded[:, top : top + 8, left : left + 8] for top in range(9) for left in range(9)]
        candidates += [c.flip(-1) for c in candidates]
        assert any(torch.equal(out[i], c) for c in candidates)


@pytest.mark.parametrize("augment", ["affine", "crop_flip"])
def test_augmentations_keep_shapes_in_both_loaders(augment):
    for kind in ("torch", "device"):
        x, y = next(iter(loader(kind, Partition(0, 1), augment=augment)))
        assert x.shape == (16, 3, 8, 8) and y.shape == (16,)


@pytest.mark.parametrize("augment", ["none", "affine", "crop_flip"])
def test_device_loader_gives_the_same_batches_whatever_its_block(monkeypatch, augment):
    # Blocks of every batch at once, of 2 batches (blocks of 40, 40, 16 samples) and of one
    # batch each must give the same values: every step of the preparation is per sample.
    from dpstudy.engine import loaders

    PAIR = 2 * 20 * 3 * 8 * 8 * 4  # the bytes of two float batches of 20

    def batches(block_bytes, channels_last=False):
        monkeypatch.setattr(loaders, "BLOCK_BYTES", block_bytes)
        dl = loader("device", Partition(0, 1), augment=augment, batch=20)
        dl.channels_last = channels_last
        dl.set_epoch(4)
        expected = {0: 20, PAIR: 40, 1 << 30: (1 << 30) // (20 * 768) * 20}[block_bytes]  # 768 bytes a sample
        assert dl.block_size() == expected
        return list(dl)

    whole, pairs, single = batches(1 << 30), batches(PAIR), batches(0)
    assert [len(x) for x, _ in single] == [20, 20, 20, 20, 16]
    for (xa, ya), (xb, yb), (xc, yc) in zip(whole, pairs, single, strict=True):
        assert torch.equal(xa, xc) and torch.equal(xb, xc) and torch.equal(ya, yc) and torch.equal(yb, yc)
    last = batches(PAIR, channels_last=True)[-1][0]
    assert last.is_contiguous(memory_format=torch.channels_last) and torch.equal(last, single[-1][0])
