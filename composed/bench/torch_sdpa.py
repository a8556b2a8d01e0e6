# torch_sdpa.py: PyTorch's fp16 SDPA (cuDNN and flash backends) timed like the lab's stages; one JSON line a case.
import json
import math
import statistics
import sys
import threading

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# (B, H, S, D, causal, Hkv) each: the ladder's shapes, given by xtask/src/ladder.rs as `--shapes JSON` (one list,
# one place); Hkv < H is grouped-query attention.
def shapes_from_args(argv):
    if len(argv) == 3 and argv[1] == "--shapes":
        return [tuple(x) for x in json.loads(argv[2])]
    raise SystemExit("usage: torch_sdpa.py --shapes '[[B, H, S, D, causal, Hkv], ...]'")
# Launches captured back to back in one CUDA graph (composed::bench::BACK_TO_BACK): per-launch time.
BACK_TO_BACK = 20
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


class Telemetry:
    """The SM clock and power over the timed replays, as the lab's own timings report them (lab::telemetry): pynvml
    (the nvidia-ml-py wheel) sampling the device every 10 ms on a thread; nothing where pynvml or the device is missing."""

    def __init__(self):
        self.samples, self.done, self.thread, self.energy_mj = [], threading.Event(), None, []
        try:
            import pynvml

            pynvml.nvmlInit()
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            self.nvml = pynvml
            self.dev = pynvml.nvmlDeviceGetHandleByPciBusId(f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")
            self.limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.dev) / 1e3
        except Exception:  # no pynvml, no driver library, or a device NVML does not know: no readings
            self.dev = None

    def read(self):
        n = self.nvml
        why = n.nvmlDeviceGetCurrentClocksThrottleReasons(self.dev)
        slow = (n.nvmlClocksThrottleReasonHwSlowdown | n.nvmlClocksThrottleReasonSwThermalSlowdown
                | n.nvmlClocksThrottleReasonHwThermalSlowdown | n.nvmlClocksThrottleReasonHwPowerBrakeSlowdown)
        self.samples.append((n.nvmlDeviceGetClockInfo(self.dev, n.NVML_CLOCK_SM), n.nvmlDeviceGetPowerUsage(self.dev) / 1e3,
                             bool(why & n.nvmlClocksThrottleReasonSwPowerCap), bool(why & slow)))

    def energy(self):
        """NVML's total-energy counter (mJ since the driver loaded), where it keeps one."""
        try:
            self.energy_mj.append(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.dev))
        except Exception:  # no counter on this device: no energy, never a wrong one
            pass

    def __enter__(self):
        if self.dev is not None:
            self.read()
            self.energy()
            self.thread = threading.Thread(target=self.run, daemon=True)
            self.thread.start()
        return self

    def run(self):
        while not self.done.wait(0.01):
            self.read()

    def __exit__(self, *exc):
        if self.thread is not None:
            self.done.set()
            self.thread.join()
            self.read()
            self.energy()

    def summary(self, launches):
        """The JSON fields of the ladder's rows: median SM MHz and W, the shares of samples at the power cap and in a
        thermal or hardware slowdown, and (where NVML keeps the counter) a launch's energy over `launches` launches."""
        if not self.samples:
            return {}
        med = statistics.median
        out = {"sm_mhz": med([s[0] for s in self.samples]), "power_w": med([s[1] for s in self.samples]),
               "power_limit_w": self.limit_w, "power_capped": sum(s[2] for s in self.samples) / len(self.samples),
               "slowdown": sum(s[3] for s in self.samples) / len(self.samples),
               "samples": len(self.samples)}
        if len(self.energy_mj) == 2 and self.energy_mj[1] >= self.energy_mj[0]:
            out["mj_per_launch"] = (self.energy_mj[1] - self.energy_mj[0]) / launches
        return out


def replay_times(graphs, warmup, iters):
    """Per-launch p50, p90 and mean: each graph holds BACK_TO_BACK launches; about 1.5 s of timed work, >= 10 replays;
    and the clock and power meanwhile (Telemetry.summary)."""
    sets = len(graphs)
    for i in range(warmup):
        graphs[i % sets].replay()
    a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    graphs[0].replay()
    e.record()
    torch.cuda.synchronize()
    iters = max(10, min(iters, int(1.5e6 / max(1.0, a.elapsed_time(e) * 1e3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    with Telemetry() as t:
        for i, (a, e) in enumerate(events):
            a.record()
            graphs[i % sets].replay()
            e.record()
        torch.cuda.synchronize()
    us = sorted(a.elapsed_time(e) * 1e3 / BACK_TO_BACK for a, e in events)
    return us[len(us) // 2], us[round((len(us) - 1) * 0.9)], sum(us) / len(us), t.summary(iters * BACK_TO_BACK)


def time_one(backend, shape, warmup=5, iters=100, sets=3):
    """BACK_TO_BACK launches per CUDA graph, one graph per input set, replayed between CUDA events."""
    b, h, s, d, causal, hkv = shape
    sets = 1 if s > 4096 else sets
    gen = torch.Generator(device="cuda").manual_seed(0)
    make = lambda heads: torch.randn(b, heads, s, d, device="cuda", dtype=torch.float16, generator=gen)
    inputs = [(make(h), make(hkv), make(hkv)) for _ in range(sets)]
    gqa = {"enable_gqa": True} if hkv != h else {}
    sdpa = lambda q, k, v, is_causal: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, **gqa)
    graphs = []
    with sdpa_kernel(backend):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                sdpa(*inputs[i % sets], is_causal=causal)
        torch.cuda.current_stream().wait_stream(side)
        for x in inputs:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(BACK_TO_BACK):
                    sdpa(*x, is_causal=causal)
            graphs.append(g)
    return replay_times(graphs, warmup, iters)


def cudnn_fp8_graph(handle, q, k, v, causal):
    """cuDNN's FP8 SDPA (graph.sdpa_fp8) for E4M3 q, k, v [B, H, S, D]: returns (graph, o, amax_o, run), where
    run(descales, scales, ws) packs q, k, v, o, the six scale tensors [descale_q, descale_k, descale_v,
    descale_s, scale_s, scale_o] (1x1x1x1 f32 each) and executes. O is E4M3 (what Hopper requires), no stats."""
    import cudnn  # the wheel travels with the bundle (--no-deps); its absence is reported by the caller

    e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    d = q.shape[-1]
    o = torch.empty_like(q)
    amax_s = torch.empty(1, 1, 1, 1, dtype=torch.float32, device="cuda")
    amax_o = torch.empty_like(amax_s)
    g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    tq, tk, tv = (g.tensor(dim=list(x.shape), stride=list(x.stride()), data_type=e4m3) for x in (q, k, v))
    sc = [g.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32) for _ in range(6)]
    to, _, tas, tao = g.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=sc[0], descale_k=sc[1], descale_v=sc[2],
                                descale_s=sc[3], scale_s=sc[4], scale_o=sc[5], generate_stats=False,
                                attn_scale=1.0 / math.sqrt(d), use_causal_mask=causal)
    to.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride())).set_data_type(e4m3)
    for t in (tas, tao):
        t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
    pack = {tq: q, tk: k, tv: v, to: o, tas: amax_s, tao: amax_o}

    def run(scales):
        p = dict(pack)
        p.update({t: x for t, x in zip(sc, scales)})
        g.execute(p, ws, handle=handle)

    return g, o, amax_o, pack, sc, ws, run


def e4m3_input(dims, gen, codes):
    """A standard-normal tensor as E4M3 and its descale: `unit` casts it as it is (descale 1: most codes within
    ±4, the low end of E4M3's range); `amax` scales it by 448 / max|x| first (per tensor), so that its codes span
    the format, as the lab's stages get theirs (fixtures' amax / 448 scales)."""
    x = torch.randn(*dims, device="cuda", generator=gen)
    if codes == "unit":
        return x.to(torch.float8_e4m3fn), 1.0
    scale = 448.0 / x.abs().amax().item()
    return (x * scale).to(torch.float8_e4m3fn), 1.0 / scale


def time_cudnn_fp8(shape, warmup=5, iters=100, sets=3, codes="unit"):
    """cuDNN's own FP8 SDPA: E4M3 Q, K, V [B, H, S, D] (`codes`: e4m3_input's), their descales, FP8 O, no stats;
    one CUDA graph per input set, replayed between events."""
    import cudnn

    b, h, s, d, causal, hkv = shape
    sets = 1 if s > 4096 else sets
    handle = cudnn.create_handle()
    gen = torch.Generator(device="cuda").manual_seed(0)
    one = lambda x: torch.full((1, 1, 1, 1), x, dtype=torch.float32, device="cuda")
    runs = []
    for _ in range(sets):
        (q, dq), (k, dk), (v, dv) = (e4m3_input((b, n, s, d), gen, codes) for n in (h, hkv, hkv))
        g, _, _, pack, sc, ws, _ = cudnn_fp8_graph(handle, q, k, v, causal)
        pack.update({t: one(x) for t, x in zip(sc, (dq, dk, dv, 1.0, 1.0, 1.0))})
        runs.append((g, pack, ws))
    side = torch.cuda.Stream()
    graphs = []
    with torch.cuda.stream(side):
        cudnn.set_stream(handle=handle, stream=side.cuda_stream)
        for g, pack, ws in runs:
            g.execute(pack, ws, handle=handle)
        side.synchronize()
        for g, pack, ws in runs:
            cg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cg, stream=side):
                cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
                for _ in range(BACK_TO_BACK):
                    g.execute(pack, ws, handle=handle)
            graphs.append(cg)
    return replay_times(graphs, warmup, iters)


def main():
    shapes = shapes_from_args(sys.argv)
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    for shape in shapes:
        try:
            p50, p90, mean, tel = time_cudnn_fp8(shape)
            print(json.dumps({"backend": "cudnn-fp8", "shape": shape[:4] + (shape[5],), "causal": shape[4], "p50_us": p50, "p90_us": p90, "mean_us": mean, **tel}), flush=True)
        except Exception as e:  # no wheel, or cuDNN refuses the shape: reported, never silently absent
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(json.dumps({"backend": "cudnn-fp8", "shape": shape[:4] + (shape[5],), "causal": shape[4], "error": why}), flush=True)
        for name, backend in BACKENDS.items():
            try:
                p50, p90, mean, tel = time_one(backend, shape)
                print(json.dumps({"backend": name, "shape": shape[:4] + (shape[5],), "causal": shape[4], "p50_us": p50, "p90_us": p90, "mean_us": mean, **tel}), flush=True)
            except RuntimeError as e:  # a backend that refuses a shape is reported, not fatal
                print(json.dumps({"backend": name, "shape": shape[:4] + (shape[5],), "causal": shape[4], "error": str(e).splitlines()[0]}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
