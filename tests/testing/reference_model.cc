#include "tests/testing/reference_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/model/dtype.h"

namespace chunkserve::testing {

std::vector<double> ReferenceModel::Tensor(const std::string& name) const {
  auto t = model_.store().Get(name);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  std::vector<float> f(static_cast<size_t>(t->num_elements()));
  model::ConvertToFloat(t->dtype, t->data, f);
  return std::vector<double>(f.begin(), f.end());
}

ReferenceModel::ReferenceModel(const model::LoadedModel& model)
    : model_(model), c_(model.config()) {
  embed_ = Tensor("model.embed_tokens.weight");
  lm_head_ = c_.tie_word_embeddings ? embed_ : Tensor("lm_head.weight");
  final_norm_ = Tensor("model.norm.weight");
  for (int i = 0; i < c_.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer l;
    l.in_norm = Tensor(p + "input_layernorm.weight");
    l.wq = Tensor(p + "self_attn.q_proj.weight");
    l.wk = Tensor(p + "self_attn.k_proj.weight");
    l.wv = Tensor(p + "self_attn.v_proj.weight");
    l.wo = Tensor(p + "self_attn.o_proj.weight");
    if (c_.qkv_bias) {
      l.bq = Tensor(p + "self_attn.q_proj.bias");
      l.bk = Tensor(p + "self_attn.k_proj.bias");
      l.bv = Tensor(p + "self_attn.v_proj.bias");
    }
    l.post_norm = Tensor(p + "post_attention_layernorm.weight");
    l.gate = Tensor(p + "mlp.gate_proj.weight");
    l.up = Tensor(p + "mlp.up_proj.weight");
    l.down = Tensor(p + "mlp.down_proj.weight");
    layers_.push_back(std::move(l));
  }
}

namespace {

// y = W x (+ b), W row-major [out][in].
std::vector<double> MatVec(const std::vector<double>& w, const std::vector<double>& b,
                           const std::vector<double>& x, int out) {
  const size_t in = x.size();
  std::vector<double> y(out);
  for (int o = 0; o < out; ++o) {
    double s = b.empty() ? 0.0 : b[o];
    for (size_t i = 0; i < in; ++i) s += w[o * in + i] * x[i];
    y[o] = s;
  }
  return y;
}

std::vector<double> Norm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

void Rope(std::vector<double>& v, int heads, int hd, int pos, double theta) {
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < hd / 2; ++i) {
      const double freq = std::pow(theta, -2.0 * i / hd);
      const double a = v[h * hd + i], b = v[h * hd + i + hd / 2];
      const double cs = std::cos(pos * freq), sn = std::sin(pos * freq);
      v[h * hd + i] = a * cs - b * sn;
      v[h * hd + i + hd / 2] = b * cs + a * sn;
    }
  }
}

}  // namespace

std::vector<std::vector<double>> ReferenceModel::Logits(std::span<const TokenId> tokens) const {
  const int n = static_cast<int>(tokens.size());
  const int H = c_.hidden_size, hd = c_.head_dim, nq = c_.num_qo_heads, nkv = c_.num_kv_heads;
  std::vector<std::vector<double>> x(n);
  for (int t = 0; t < n; ++t) {
    x[t].assign(embed_.begin() + static_cast<size_t>(tokens[t]) * H,
                embed_.begin() + static_cast<size_t>(tokens[t] + 1) * H);
  }
  for (const Layer& l : layers_) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const auto h = Norm(x[t], l.in_norm, c_.rms_norm_eps);
      q[t] = MatVec(l.wq, l.bq, h, nq * hd);
      k[t] = MatVec(l.wk, l.bk, h, nkv * hd);
      v[t] = MatVec(l.wv, l.bv, h, nkv * hd);
      Rope(q[t], nq, hd, t, c_.rope_theta);
      Rope(k[t], nkv, hd, t, c_.rope_theta);
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> attn(nq * hd, 0.0);
      for (int h = 0; h < nq; ++h) {
        const int g = h / (nq / nkv);
        std::vector<double> s(t + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[j][g * hd + i];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= t; ++j) {
          for (int i = 0; i < hd; ++i) attn[h * hd + i] += s[j] / z * v[j][g * hd + i];
        }
      }
      const auto o = MatVec(l.wo, {}, attn, H);
      for (int i = 0; i < H; ++i) x[t][i] += o[i];
      const auto h2 = Norm(x[t], l.post_norm, c_.rms_norm_eps);
      const auto gt = MatVec(l.gate, {}, h2, c_.intermediate_size);
      auto up = MatVec(l.up, {}, h2, c_.intermediate_size);
      for (int i = 0; i < c_.intermediate_size; ++i) up[i] *= gt[i] / (1.0 + std::exp(-gt[i]));
      const auto d = MatVec(l.down, {}, up, H);
      for (int i = 0; i < H; ++i) x[t][i] += d[i];
    }
  }
  std::vector<std::vector<double>> logits(n);
  for (int t = 0; t < n; ++t) {
    logits[t] = MatVec(lm_head_, {}, Norm(x[t], final_norm_, c_.rms_norm_eps), c_.vocab_size);
  }
  return logits;
}

std::vector<TokenId> ReferenceModel::Greedy(std::span<const TokenId> prompt, int n) const {
  std::vector<TokenId> seq(prompt.begin(), prompt.end());
  std::vector<TokenId> out;
  for (int i = 0; i < n; ++i) {
    const auto logits = Logits(seq).back();
    TokenId best = 0;
    for (size_t j = 1; j < logits.size(); ++j) {
      if (logits[j] > logits[best]) best = static_cast<TokenId>(j);
    }
    out.push_back(best);
    seq.push_back(best);
  }
  return out;
}

}  // namespace chunkserve::testing
