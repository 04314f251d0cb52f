#include "common/estimate/blip2_ops.h"

namespace llmctl::estimate::blip2 {

Tensor Ops::Linear(const Tensor& x, int64_t rows, int64_t in, int64_t out, bool trains,
                   std::string_view name, bool nf4) {
  const bool quantized = nf4 && r_.qlora;
  const TracedLinear l =
      TraceLinear(set_, {r_.autocast, r_.lora_dropout > 0.0, r_.cuda, r_.rank}, x, rows, in, out,
                  trains && !quantized, quantized, r_.Targeted(name));
  const int64_t adapter = r_.Targeted(name) ? r_.rank * std::max(in, out) : 0;
  largest_weight_gradient_ =
      std::max({largest_weight_gradient_, trains && !quantized ? in * out : 0, adapter});
  if (quantized) {
    // While Nf4LinearFunction runs: the input cast to the compute dtype, the dequantised weight
    // (out, in) and the product, then cast back to the input's dtype.
    const bool cast = x.element != r_.compute;
    Alive(Unsaved(x) + (cast ? static_cast<uint64_t>(rows * in) * r_.compute : 0) +
          static_cast<uint64_t>(in * out + rows * out) * r_.compute + (cast ? l.base.bytes : 0));
  } else {
    Alive(Unsaved(x) + Unsaved(l.base_input) + l.base.bytes);
  }
  if (l.adapter_element > 0) {
    // lora_B's output, its scaled copy and the sum, beside the base's output.
    Alive(Unsaved(x) + l.base.bytes +
          3 * static_cast<uint64_t>(rows * out) * static_cast<uint64_t>(l.adapter_element));
  }
  return l.output;
}

Tensor Ops::LayerNorm(const Tensor& x, int64_t rows, int64_t width, bool trains) {
  Tensor input = x;
  if (r_.autocast && x.element != kFp32) input = New(rows * width, kFp32, x.requires_grad);
  const bool grad = input.requires_grad || trains;
  if (grad) {
    Save(input);
    Save(New(rows, input.element, false));
    Save(New(rows, input.element, false));
  }
  const Tensor y = New(rows * width, input.element, grad);
  // native_layer_norm reads a contiguous copy of an expanded input (the Q-Former's queries).
  Alive(Unsaved(x) + Unsaved(input) + 2 * y.bytes);
  return y;
}

Tensor Ops::RmsNorm(const Tensor& x, int64_t rows, int64_t width, bool trains) {
  const bool grad = x.requires_grad || trains;
  if (r_.fused) {
    if (grad) {
      Save(x);
      Save(New(rows, kFp32, false));
    }
    const Tensor y = New(rows * width, x.element, grad);
    Alive(Unsaved(x) + y.bytes);
    return y;
  }
  const Tensor x32 = x.element == kFp32 ? x : New(rows * width, kFp32, x.requires_grad);
  if (x.requires_grad) {
    Save(x32);                     // pow and the product with rsqrt
    Save(New(rows, kFp32, true));  // rsqrt(variance)
  }
  const Tensor normed = New(rows * width, x.element, x.requires_grad);
  if (trains) Save(normed);  // the weight's gradient
  const Tensor y = New(rows * width, x.element, grad);
  // pow's and the product's float32 results, the cast and the output.
  Alive(Unsaved(x) + Unsaved(x32) + 2 * static_cast<uint64_t>(rows * width) * kFp32 +
        Unsaved(normed) + y.bytes);
  return y;
}

Tensor Ops::Dropout(const Tensor& x, int64_t elements, double p) {
  if (p <= 0.0) return x;
  const Tensor mask = New(elements, r_.cuda ? 1 : x.element, false);
  if (x.requires_grad) Save(mask);
  const Tensor y = New(elements, x.element, x.requires_grad);
  Alive(Unsaved(x) + Unsaved(mask) + y.bytes);
  return y;
}

Tensor Ops::Add(const Tensor& a, const Tensor& b, int64_t elements) {
  const Tensor y = New(elements, Wider(a, b), a.requires_grad || b.requires_grad);
  Alive(Unsaved(a) + Unsaved(b) + y.bytes);
  return y;
}

Tensor Ops::GatedGelu(const Tensor& gate, const Tensor& up, int64_t elements) {
  const bool grad = gate.requires_grad || up.requires_grad;
  if (r_.fused) {
    if (grad) {
      Save(gate);
      Save(up);
    }
    const Tensor y = New(elements, Wider(gate, up), grad);
    Alive(Unsaved(gate) + Unsaved(up) + y.bytes);
    return y;
  }
  const int e = gate.element;
  if (gate.requires_grad) {
    Save(gate);
    Save(New(elements, e, true));  // tanh's result
    Save(New(elements, e, true));  // 1 + tanh
    Save(New(elements, e, true));  // 0.5 x
  }
  const Tensor gelu = New(elements, e, gate.requires_grad);
  // x^3, its scaled sum and tanh's argument: two of them at once.
  Alive(Unsaved(gate) + Unsaved(up) + 2 * static_cast<uint64_t>(elements) * e + gelu.bytes);
  if (up.requires_grad) Save(gelu);
  if (gate.requires_grad) Save(up);
  const Tensor y = New(elements, Wider(gelu, up), grad);
  Alive(Unsaved(gelu) + Unsaved(up) + y.bytes);
  return y;
}

Tensor Ops::Flash(const Tensor& q, const Tensor& k, const Tensor& v, int64_t rows_q, int64_t heads,
                  int64_t width) {
  const bool grad = q.requires_grad || k.requires_grad || v.requires_grad;
  const Tensor out = New(rows_q * width, q.element, grad);
  if (grad) {
    for (const Tensor* t : {&q, &k, &v, &out}) Save(*t);
    Save(New(rows_q * heads, kFp32, false));
  }
  Alive(Unsaved(q) + Unsaved(k) + Unsaved(v) + out.bytes);
  return out;
}

Tensor Ops::Math(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch, int64_t heads,
                 int64_t tq, int64_t tk, int64_t head_dim, double p, bool mask_grad) {
  const bool attn_grad = q.requires_grad || k.requires_grad || mask_grad;
  if (r_.cuda) {
    // CUDA's memory-efficient kernel takes dropout (its seed, not a mask) and an additive bias: it
    // keeps q, k, v, its output and the fp32 log-sum-exp (B, H, Tq rounded up to 32), as for
    // llama_trace.cc's LLaMA. Not measured on a GPU for BLIP-2 yet.
    const bool grad = attn_grad || v.requires_grad;
    const Tensor out = New(batch * tq * heads * head_dim, q.element, grad);
    if (grad) {
      for (const Tensor* t : {&q, &k, &v, &out}) Save(*t);
      Save(New(batch * heads * ((tq + 31) / 32 * 32), kFp32, false));
    }
    Alive(Unsaved(q) + Unsaved(k) + Unsaved(v) + out.bytes);
    return out;
  }
  const int e = kFp32;
  const int64_t qn = batch * heads * tq * head_dim;
  const int64_t kn = batch * heads * tk * head_dim;
  const int64_t an = batch * heads * tq * tk;
  const Tensor qc = New(qn, e, q.requires_grad);
  const Tensor kc = New(kn, e, k.requires_grad);
  if (k.requires_grad) Save(qc);
  if (q.requires_grad) Save(kc);
  const Tensor probs = New(an, e, attn_grad);
  if (attn_grad) Save(probs);
  Tensor dropped = probs;
  if (p > 0.0) {
    const Tensor mask = New(an, e, false);
    if (attn_grad) Save(mask);
    dropped = New(an, e, attn_grad);
  }
  const Tensor vc = New(kn, e, v.requires_grad);
  if (v.requires_grad) Save(dropped);
  if (attn_grad) Save(vc);
  // The scores beside the softmax, then the product's output and its copies.
  Alive(Unsaved(q) + Unsaved(k) + Unsaved(v) + Unsaved(qc) + Unsaved(kc) + 2 * probs.bytes +
        Unsaved(dropped) + Unsaved(vc));
  const Tensor y = New(qn, q.element, attn_grad || v.requires_grad);
  Alive(Unsaved(dropped) + Unsaved(vc) + static_cast<uint64_t>(qn) * e +
        (q.element != e ? static_cast<uint64_t>(qn) * q.element : 0) + y.bytes);
  return y;
}

}  // namespace llmctl::estimate::blip2
