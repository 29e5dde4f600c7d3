#!/usr/bin/env python3
"""The digits check of issue 37: the CIFAR-10 CNN's architecture trained on scikit-learn's
bundled digits by kiln's compiled training step and by PyTorch, from the same initial weights,
in the same data order, with the same optimizer; test accuracies and per-step losses compared.

    train_digits.py prepare DIR [--epochs E] [--seed S]
        writes DIR/{x,y}_{train,test}.npy (8x8 digits scaled to [-1, 1], upsampled 4x to 32x32,
        the one channel repeated into 3) and DIR/order.npy (each epoch's sample order)
    (then: cargo run --release -p kiln-compiler --example train_cifar -- --data DIR ...,
        which writes DIR/kiln/{init/*.npy, losses.npy, accuracy.txt})
    train_digits.py compare DIR [--batch B] [--lr X] [--momentum X] [--threads T]
                                [--precision bf16]
        trains PyTorch's copy from DIR/kiln/init in DIR/order.npy's order, in f32 and in f64,
        and prints both accuracies and the loss differences step by step; with --precision
        bf16, against kiln's mixed-precision run (train_cifar --precision bf16, DIR/kiln-bf16)
        PyTorch's with torch.autocast("cpu", dtype=torch.bfloat16) around the forward pass and
        the loss, and PyTorch f32 (the test accuracy of each evaluated in f32)
    train_digits.py bench [--threads T] [--steps N] [--precision bf16]
        PyTorch eager's training step of the CIFAR-10 CNN, batch 64, 32x32x3, SGD with
        momentum: the median step time (with --precision bf16, under autocast to bf16)

`make train-digits` runs the three steps of the check in order.
"""

import argparse
import os
import sys
import time
import warnings

import numpy as np

# PyTorch's PyPI build is a CUDA one; the check runs on the CPU, whatever the driver says.
warnings.filterwarnings("ignore", message="CUDA initialization")

PARAMS = [
    "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias",
    "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias",
]


def prepare(args):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0 - 0.5) / 0.5  # [n, 8, 8] in [-1, 1]
    x = np.kron(x, np.ones((1, 4, 4), dtype=np.float32))  # nearest upsampling to 32x32
    x = np.repeat(x[:, None], 3, axis=1)  # [n, 3, 32, 32]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=args.seed, stratify=y)
    rng = np.random.default_rng(args.seed)
    order = np.stack([rng.permutation(len(y_train)) for _ in range(args.epochs)]).astype(np.int64)
    os.makedirs(args.dir, exist_ok=True)
    for name, a in [("x_train", x_train), ("y_train", y_train), ("x_test", x_test),
                    ("y_test", y_test), ("order", order)]:
        np.save(os.path.join(args.dir, name + ".npy"), np.ascontiguousarray(a))
    print(f"digits: {len(y_train)} training and {len(y_test)} test images, 3x32x32; "
          f"{args.epochs} epochs -> {args.dir}")


def net(torch):
    nn = torch.nn

    class CifarNet(nn.Module):
        """kiln_ir::models::cifarnet: conv, maxpool, relu (in that order), twice; three
        fully connected layers."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 6, 5)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(400, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, x):
            f = nn.functional
            x = f.relu(f.max_pool2d(self.conv1(x), 2))
            x = f.relu(f.max_pool2d(self.conv2(x), 2))
            x = torch.flatten(x, 1)
            x = f.relu(self.fc1(x))
            x = f.relu(self.fc2(x))
            return self.fc3(x)

    return CifarNet()


def train_torch(torch, d, init, dtype, args, autocast=False):
    model = net(torch).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(init[name]).to(dtype))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y, order = d["x_train"], d["y_train"], d["order"]
    per_epoch = len(y) // args.batch
    losses = []
    for epoch in order:
        for b in range(per_epoch):
            rows = epoch[b * args.batch:(b + 1) * args.batch]
            bx = torch.from_numpy(x[rows]).to(dtype)
            by = torch.from_numpy(y[rows])
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(model(bx), by)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    with torch.no_grad():
        pred = model(torch.from_numpy(d["x_test"]).to(dtype)).argmax(1).numpy()
    return np.array(losses), float((pred == d["y_test"]).mean())


def compare(args):
    import torch

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    d = {n: np.load(os.path.join(args.dir, n + ".npy"))
         for n in ["x_train", "y_train", "x_test", "y_test", "order"]}
    if args.precision == "bf16":
        return compare_bf16(torch, d, args)
    init, kiln_losses, kiln_acc = kiln_run(os.path.join(args.dir, "kiln"))
    t32, acc32 = train_torch(torch, d, init, torch.float32, args)
    t64, acc64 = train_torch(torch, d, init, torch.float64, args)
    if len(t32) != len(kiln_losses):
        sys.exit(f"kiln took {len(kiln_losses)} steps, PyTorch {len(t32)}: not the same run")
    diff = np.abs(kiln_losses - t32)
    base = np.abs(t32 - t64)
    first = min(10, len(diff))
    print(f"steps: {len(diff)} (batch {args.batch}, SGD lr {args.lr} momentum {args.momentum})")
    print(f"loss at step 1 / last: kiln {kiln_losses[0]:.6f} / {kiln_losses[-1]:.6f}, "
          f"PyTorch f32 {t32[0]:.6f} / {t32[-1]:.6f}")
    print(f"|kiln - PyTorch f32| per step: max {diff.max():.2e} (step {diff.argmax() + 1}), "
          f"first {first} steps max {diff[:first].max():.2e}, median {np.median(diff):.2e}")
    print(f"|PyTorch f32 - PyTorch f64| per step (float32's own drift): max {base.max():.2e}, "
          f"first {first} steps max {base[:first].max():.2e}")

    def past(d, tol):
        over = np.nonzero(d > tol)[0]
        return f"step {over[0] + 1}" if len(over) else "never"

    for tol in [1e-5, 1e-4, 1e-3, 1e-2]:
        print(f"first step differing by more than {tol:.0e}: kiln vs PyTorch f32 {past(diff, tol)}, "
              f"PyTorch f32 vs f64 {past(base, tol)}")
    print(f"test accuracy: kiln {kiln_acc * 100:.2f}%, PyTorch f32 {acc32 * 100:.2f}%, "
          f"PyTorch f64 {acc64 * 100:.2f}%")
    gap = abs(kiln_acc - acc32) * 100
    if gap > 1.0:
        sys.exit(f"FAIL: kiln's accuracy is {gap:.2f} points from PyTorch's (more than 1)")
    print(f"ok: within {gap:.2f} points of PyTorch's accuracy")


def kiln_run(kdir):
    """What train_cifar --data wrote into kdir: its initial weights, each step's loss and the
    test accuracy."""
    init = {n: np.load(os.path.join(kdir, "init", n + ".npy")) for n in PARAMS}
    losses = np.load(os.path.join(kdir, "losses.npy")).astype(np.float64)
    with open(os.path.join(kdir, "accuracy.txt")) as f:
        return init, losses, float(f.read())


def compare_bf16(torch, d, args):
    init, kiln_losses, kiln_acc = kiln_run(os.path.join(args.dir, "kiln-bf16"))
    f32_path = os.path.join(args.dir, "kiln", "accuracy.txt")
    kiln_f32 = float(open(f32_path).read()) if os.path.exists(f32_path) else None
    tb, accb = train_torch(torch, d, init, torch.float32, args, autocast=True)
    t32, acc32 = train_torch(torch, d, init, torch.float32, args)
    if len(tb) != len(kiln_losses):
        sys.exit(f"kiln took {len(kiln_losses)} steps, PyTorch {len(tb)}: not the same run")
    diff = np.abs(kiln_losses - tb)
    base = np.abs(tb - t32)
    first = min(10, len(diff))
    print(f"steps: {len(diff)} (batch {args.batch}, SGD lr {args.lr} momentum {args.momentum}), "
          f"mixed precision bf16")
    print(f"loss at step 1 / last: kiln bf16 {kiln_losses[0]:.6f} / {kiln_losses[-1]:.6f}, "
          f"PyTorch autocast {tb[0]:.6f} / {tb[-1]:.6f}, PyTorch f32 {t32[0]:.6f} / {t32[-1]:.6f}")
    print(f"|kiln bf16 - PyTorch autocast| per step: max {diff.max():.2e}, first {first} steps "
          f"max {diff[:first].max():.2e}, median {np.median(diff):.2e}")
    print(f"|PyTorch autocast - PyTorch f32| per step (bf16's own drift): max {base.max():.2e}, "
          f"first {first} steps max {base[:first].max():.2e}, median {np.median(base):.2e}")
    f32_text = f", kiln f32 {kiln_f32 * 100:.2f}%" if kiln_f32 is not None else ""
    print(f"test accuracy (evaluated in f32): kiln bf16 {kiln_acc * 100:.2f}%{f32_text}, "
          f"PyTorch autocast bf16 {accb * 100:.2f}%, PyTorch f32 {acc32 * 100:.2f}%")
    gap = abs(kiln_acc - accb) * 100
    if gap > 1.0:
        sys.exit(f"FAIL: kiln bf16's accuracy is {gap:.2f} points from PyTorch autocast's")
    print(f"ok: within {gap:.2f} points of PyTorch autocast's accuracy")


def bench(args):
    import torch

    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    # TF32 off on a GPU: kiln's f32 step is IEEE f32.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = net(torch).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    times = []
    for s in range(args.steps):
        # The batch crosses to the device inside the step, as kiln's does.
        x = torch.rand(64, 3, 32, 32, generator=g) * 2 - 1
        y = torch.randint(0, 10, (64,), generator=g)
        t = time.perf_counter()
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()  # waits for the device
        times.append(time.perf_counter() - t)
    t = sorted(times[5:])
    print(f"PyTorch {torch.__version__} eager, {args.precision}, {args.device}, {args.threads} thread(s): "
          f"median step {t[len(t) // 2] * 1e3:.2f} ms over {len(t)} steps")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("dir")
    a.add_argument("--epochs", type=int, default=10)
    a.add_argument("--seed", type=int, default=0)
    a = sub.add_parser("compare")
    a.add_argument("dir")
    a.add_argument("--batch", type=int, default=64)
    a.add_argument("--lr", type=float, default=0.01)
    a.add_argument("--momentum", type=float, default=0.9)
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    a = sub.add_parser("bench")
    a.add_argument("--threads", type=int, default=1)
    a.add_argument("--steps", type=int, default=50)
    a.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    a.add_argument("--device", default="cpu", help="cpu or cuda")
    args = p.parse_args()
    {"prepare": prepare, "compare": compare, "bench": bench}[args.cmd](args)


if __name__ == "__main__":
    main()
