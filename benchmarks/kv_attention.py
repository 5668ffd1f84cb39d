"""One layer's attention over a full KV ring at the 7B's size ([1, 32, 3000, 128] keys and
values), in onnxruntime on this CPU, with the ring stored in 4, 2 or 1 bytes: does a narrower
ring pay with the kernels onnxruntime has here?

    python benchmarks/kv_attention.py [--threads 2] [--rounds 5]

The step attends the whole ring every frame (32 layers: 3.1 GB of float32 for the 7B), so the
ring is 40% of the CPU recipe's bytes. Forms timed (the same q, K, V; softmax in float32):

    float32          the exported graph's form: q K^T (a fused transposed MatMul), softmax, p V
    float32, K^T     the keys stored transposed ([Dh, T] per head): q K^T without a transpose
    float32, MHA     onnxruntime's fused MultiHeadAttention (com.microsoft) on the same ring
    fp16, cast       the ring stored float16, cast to float32 in the step (what `--kv-dtype
                     float16` exports for onnxruntime: x86 has no float16 MatMul)
    fp16 MatMul      the products in float16 (onnxruntime's x86 CPU runs them through its own
                     casts; ARM64 with fp16 arithmetic has kernels)
    int8, cast       int8 with a scale per key and value row, dequantised in the step
    int8 integer     int8 rows, q and the probabilities quantised on the fly to uint8,
                     MatMulInteger (the VNNI dot products), scales applied after

Each: ms per layer (median of --rounds interleaved rounds of 20 calls), bytes of ring read,
GB/s, and the error of its output against float32 (max |diff| / max |float32|).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

HEADS, SLOTS, DIM = 32, 3000, 128


def _session(nodes, inputs, inits, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def forms(threads: int):
    """name -> (session, feeds, ring bytes)."""
    from onnx import TensorProto as T
    from onnx import helper

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, HEADS, 1, DIM)).astype(np.float32)
    K = rng.standard_normal((1, HEADS, SLOTS, DIM)).astype(np.float32)  # [B, H, T, Dh]
    V = rng.standard_normal((1, HEADS, SLOTS, DIM)).astype(np.float32)

    def vi(name, t, shape):
        return helper.make_tensor_value_info(name, t, shape)

    scale = [helper.make_tensor("scale", T.FLOAT, [], [DIM ** -0.5])]
    attend = [helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "Kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["s2"]),
              helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "V"], ["o"])]
    out = {}
    qi = vi("q", T.FLOAT, q.shape)
    out["float32"] = (_session(attend, [qi, vi("K", T.FLOAT, K.shape), vi("V", T.FLOAT, V.shape)],
                               scale, threads), {"q": q, "K": K, "V": V}, K.nbytes + V.nbytes)
    # the layouts and kernels of the same float32 ring: does another form read it faster?
    Kt = np.ascontiguousarray(K.transpose(0, 1, 3, 2))  # [B, H, Dh, T]
    out["float32, K^T"] = (_session(attend[1:], [qi, vi("Kt", T.FLOAT, Kt.shape),
                                                 vi("V", T.FLOAT, V.shape)], scale, threads),
                           {"q": q, "Kt": Kt, "V": V}, Kt.nbytes + V.nbytes)
    packed = q.transpose(0, 2, 1, 3).reshape(1, 1, HEADS * DIM)  # [B, 1, H * Dh]
    heads = [helper.make_tensor("heads", T.INT64, [4], [1, 1, HEADS, DIM])]
    mha = [helper.make_node("MultiHeadAttention", ["qp", "K", "V"], ["m"],
                            domain="com.microsoft", num_heads=HEADS),
           helper.make_node("Reshape", ["m", "heads"], ["m4"]),
           helper.make_node("Transpose", ["m4"], ["o"], perm=[0, 2, 1, 3])]
    out["float32, MHA"] = (_session(mha, [vi("qp", T.FLOAT, packed.shape),
                                          vi("K", T.FLOAT, K.shape), vi("V", T.FLOAT, V.shape)],
                                    heads, threads),
                           {"qp": packed, "K": K, "V": V}, K.nbytes + V.nbytes)
    K16, V16 = K.astype(np.float16), V.astype(np.float16)
    half = [vi("K16", T.FLOAT16, K.shape), vi("V16", T.FLOAT16, V.shape)]
    cast = [helper.make_node("Cast", ["K16"], ["K"], to=T.FLOAT),
            helper.make_node("Cast", ["V16"], ["V"], to=T.FLOAT)]
    out["fp16, cast"] = (_session(cast + attend, [qi, *half], scale, threads),
                         {"q": q, "K16": K16, "V16": V16}, K16.nbytes + V16.nbytes)
    products16 = [helper.make_node("Cast", ["q"], ["q16"], to=T.FLOAT16),
                  helper.make_node("Transpose", ["K16"], ["Kt"], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", ["q16", "Kt"], ["s16"]),
                  helper.make_node("Cast", ["s16"], ["s"], to=T.FLOAT),
                  helper.make_node("Mul", ["s", "scale"], ["s2"]),
                  helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
                  helper.make_node("Cast", ["p"], ["p16"], to=T.FLOAT16),
                  helper.make_node("MatMul", ["p16", "V16"], ["o16"]),
                  helper.make_node("Cast", ["o16"], ["o"], to=T.FLOAT)]
    out["fp16 MatMul"] = (_session(products16, [qi, *half], scale, threads),
                          {"q": q, "K16": K16, "V16": V16}, K16.nbytes + V16.nbytes)
    ks = np.abs(K).max(-1, keepdims=True) / 127  # [B, H, T, 1]: a scale per key row
    vs = np.abs(V).max(-1, keepdims=True) / 127
    Kq, Vq = np.rint(K / ks).astype(np.int8), np.rint(V / vs).astype(np.int8)
    ring8 = Kq.nbytes + Vq.nbytes + 2 * ks.astype(np.float16).nbytes  # scales in fp16
    dequant = [helper.make_node("Cast", ["Kq"], ["Kf"], to=T.FLOAT),
               helper.make_node("Mul", ["Kf", "ks"], ["K"]),
               helper.make_node("Cast", ["Vq"], ["Vf"], to=T.FLOAT),
               helper.make_node("Mul", ["Vf", "vs"], ["V"])]
    int8_in = [vi("Kq", T.INT8, K.shape), vi("Vq", T.INT8, V.shape)]
    out["int8, cast"] = (_session(dequant + attend, [qi, *int8_in, vi("ks", T.FLOAT, ks.shape),
                                                     vi("vs", T.FLOAT, vs.shape)],
                                  scale, threads),
                         {"q": q, "Kq": Kq, "Vq": Vq, "ks": ks, "vs": vs}, ring8)
    # scores = (q_u8 . Kq^T) * q_scale * ks_t; out = ((p * vs_t)_u8 . Vq) * p_scale
    kst = np.ascontiguousarray(ks.transpose(0, 1, 3, 2))  # [B, H, 1, T]
    vst = np.ascontiguousarray(vs.transpose(0, 1, 3, 2))
    integer = [helper.make_node("DynamicQuantizeLinear", ["q"], ["qq", "qs", "qz"]),
               helper.make_node("Transpose", ["Kq"], ["Kqt"], perm=[0, 1, 3, 2]),
               helper.make_node("MatMulInteger", ["qq", "Kqt", "qz"], ["si"]),
               helper.make_node("Cast", ["si"], ["sf"], to=T.FLOAT),
               helper.make_node("Mul", ["sf", "qs"], ["s0"]),
               helper.make_node("Mul", ["s0", "kst"], ["s1"]),
               helper.make_node("Mul", ["s1", "scale"], ["s2"]),
               helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
               helper.make_node("Mul", ["p", "vst"], ["pv"]),
               helper.make_node("DynamicQuantizeLinear", ["pv"], ["pq", "ps", "pz"]),
               helper.make_node("MatMulInteger", ["pq", "Vq", "pz"], ["oi"]),
               helper.make_node("Cast", ["oi"], ["of"], to=T.FLOAT),
               helper.make_node("Mul", ["of", "ps"], ["o"])]
    out["int8 integer"] = (_session(integer, [qi, *int8_in, vi("kst", T.FLOAT, kst.shape),
                                              vi("vst", T.FLOAT, vst.shape)], scale, threads),
                           {"q": q, "Kq": Kq, "Vq": Vq, "kst": kst, "vst": vst}, ring8)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    made = forms(args.threads)
    outputs = {name: s.run(None, feeds)[0] for name, (s, feeds, _) in made.items()}
    ref = outputs["float32"]
    per: dict[str, list[float]] = {name: [] for name in made}
    for _ in range(args.rounds):
        for name, (s, feeds, _) in made.items():
            ms = []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                s.run(None, feeds)
                ms.append(1000 * (time.perf_counter() - t0))
            per[name].append(float(np.median(ms)))
    print(f"one layer of the 7B's attention over a full ring ([1, {HEADS}, {SLOTS}, {DIM}]), "
          f"onnxruntime CPU, {args.threads} threads, median of {args.rounds} interleaved "
          f"rounds (load {os.getloadavg()[0]:.2f}); x32 layers for the frame\n")
    print("| ring | MB read | ms per layer | GB/s | x32 layers ms | error vs float32 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, (_, _, nbytes) in made.items():
        ms = float(np.median(per[name]))
        err = float(np.abs(outputs[name] - ref).max() / np.abs(ref).max())
        print(f"| {name} | {nbytes / 1e6:.0f} | {ms:.2f} | {nbytes / ms / 1e6:.1f} | "
              f"{32 * ms:.0f} | {err:.1e} |")


if __name__ == "__main__":
    main()
