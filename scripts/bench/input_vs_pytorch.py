"""The peer of `dtrain bench-input`: PyTorch's DataLoader over torchvision's ImageFolder, with the
same training transform (random-resized crop to the same size and scale range, horizontal flip,
to tensor, per-channel normalisation), at each worker count; images per second in steady state.

Two decoders, the faster one is the peer: PIL (ImageFolder's default loader) and
torchvision.io.decode_image (libjpeg-turbo and libpng in C++) with the transforms on uint8
tensors (torchvision.transforms.v2).

  python input_vs_pytorch.py ROOT --size C H W --scale LO HI --batch B --workers 1 2 --images N
"""
import argparse
import statistics
import time

import torch
import torchvision
from torchvision import datasets
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2


def loader(root, size, scale, batch, workers, decoder, grey):
    crop = [v2.RandomResizedCrop(size, scale=scale, antialias=True), v2.RandomHorizontalFlip()]
    # The statistics do not matter for speed; the arithmetic does.
    norm = v2.Normalize([0.5] * (1 if grey else 3), [0.25] * (1 if grey else 3))
    if decoder == "pil":
        tf = v2.Compose([v2.Grayscale() if grey else v2.RGB(), *crop, v2.ToImage(),
                         v2.ToDtype(torch.float32, scale=True), norm])
        ds = datasets.ImageFolder(root, transform=tf)
    else:
        mode = ImageReadMode.GRAY if grey else ImageReadMode.RGB

        def read(path):
            return decode_image(torchvision.io.read_file(path), mode=mode)

        tf = v2.Compose([*crop, v2.ToDtype(torch.float32, scale=True), norm])
        ds = datasets.ImageFolder(root, transform=tf, loader=read)
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                       persistent_workers=True, drop_last=True)


def rate(dl, images, batch):
    """Images per second over `images`, after one pass of warm-up batches (workers started)."""
    it = iter(dl)
    for _ in range(max(2, 2 * dl.num_workers)):
        next(it)
    need = max(1, images // batch)
    t0 = time.perf_counter()
    for _ in range(need):
        try:
            next(it)
        except StopIteration:
            it = iter(dl)
            next(it)
    return need * batch / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--size", type=int, nargs=3, required=True)
    p.add_argument("--scale", type=float, nargs=2, default=[0.08, 1.0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    c, h, w = a.size
    print(f"# torch {torch.__version__}, torchvision {torchvision.__version__}")
    print("| workers | decoder | images/s | all runs |")
    print("|---:|---|---:|---|")
    for workers in a.workers:
        for decoder in ("pil", "tensor"):
            dl = loader(a.root, (h, w), tuple(a.scale), a.batch, workers, decoder, c == 1)
            runs = [rate(dl, a.images, a.batch) for _ in range(a.repeats)]
            del dl
            print(f"| {workers} | {decoder} | {statistics.median(runs):.0f} | "
                  f"{' '.join(f'{r:.0f}' for r in runs)} |", flush=True)


if __name__ == "__main__":
    main()
