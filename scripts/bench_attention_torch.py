"""Reference timings for causal attention on this GPU: PyTorch's
scaled_dot_product_attention with each backend it has (flash, cuDNN,
memory-efficient), forward and forward+backward, bf16, at the shapes of the
`attnres bench` reports given (their `model:` lines; (B, H, T, head dim), all
heads as query heads), or of the 124M and 350M presets when none is given.
`attnres bench --kernels` prints ours beside; scripts/gpu_targets.py takes
cuDNN's time for the floor of a step. Needs only torch (present on the GPU
machines); not part of the build.

    python3 scripts/bench_attention_torch.py [BENCH_REPORT ...]"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def shapes(reports):
    """(B, H, T, hd) of each report's model, in order, each once."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_targets import model_shape
    out = []
    for path in reports:
        try:
            with open(path) as f:
                m = model_shape(f.read())
        except OSError as e:
            print(f"warning: {path}: {e.strerror}; skipped", file=sys.stderr)
            continue
        if not m:
            print(f"warning: {path}: no `model:` line of an attnres bench report; skipped",
                  file=sys.stderr)
            continue
        s = (m["B"], m["H"], m["T"], m["d"] // m["H"])
        if s not in out:
            out.append(s)
    return out


def main():
    todo = (len(sys.argv) > 1 and shapes(sys.argv[1:])) or [(16, 12, 1024, 64), (8, 16, 2048, 64)]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'shape (B,H,T,hd)':>22} {'backend':>10} {'fwd ms':>8} {'fwd TF/s':>9} {'f+b ms':>8} {'bwd ms':>8} {'bwd TF/s':>9}")
    for B, H, T, hd in todo:
        flops_fwd = 2.0 * B * H * T * T * hd  # causal
        for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
            q, k, v = (torch.randn(B, H, T, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            g = torch.randn(B, H, T, hd, device="cuda", dtype=torch.bfloat16)
            try:
                with sdpa_kernel([backend]):
                    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

                    def fb():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        o.backward(g)
                    both = timed(fb)
            except RuntimeError as e:
                print(f"{str((B, H, T, hd)):>22} {name:>10}   unavailable ({str(e).splitlines()[0][:60]})")
                continue
            bwd = both - fwd
            print(f"{str((B, H, T, hd)):>22} {name:>10} {fwd:8.3f} {flops_fwd / fwd * 1e-9:9.1f} "
                  f"{both:8.3f} {bwd:8.3f} {2.5 * flops_fwd / bwd * 1e-9:9.1f}")


if __name__ == "__main__":
    main()
