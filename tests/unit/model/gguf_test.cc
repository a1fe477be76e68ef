// The GGUF reader (model/gguf.h) on files written by tests/fakes/gguf_writer.h: every tensor type
// against values worked out by hand, metadata lookups, structural errors, and the conversion of a
// llama model into a Hugging Face directory (model/gguf_convert.h) that loads back to the same
// parameters.

#include "model/gguf.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "fakes/gguf_writer.h"
#include "model/gguf_convert.h"
#include "model/hf_model.h"
#include "model/transformer.h"

namespace gyre::model {
namespace {

using testing::GgufWriter;

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path =
      TempDirectory() + "/gyre_gguf_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string Block(uint16_t d, const std::vector<uint8_t>& qs, const uint16_t* m = nullptr) {
  std::string b = GgufWriter::U16(d);
  if (m != nullptr) b += GgufWriter::U16(*m);
  b.append(reinterpret_cast<const char*>(qs.data()), qs.size());
  return b;
}

TEST(GgufTest, EveryTypeDequantisesToHandValues) {
  GgufWriter w;
  w.MetaStr("general.architecture", "llama");
  w.MetaU32("llama.block_count", 30);
  w.MetaF32("llama.rope.freq_base", 100000.0f);
  w.MetaStrings("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  w.Tensor("f32", {2}, 0, GgufWriter::F32(1.5f) + GgufWriter::F32(-0.25f));
  // F16: 1.0, -2.0, 0.5, the smallest subnormal 2^-24, +inf.
  std::string f16;
  for (uint16_t h : {0x3C00, 0xC000, 0x3800, 0x0001, 0x7C00}) f16 += GgufWriter::U16(h);
  w.Tensor("f16", {5}, 1, f16);
  // BF16: 1.0, -3.0.
  w.Tensor("bf16", {2}, 30, GgufWriter::U16(0x3F80) + GgufWriter::U16(0xC040));
  // Q8_0: d = 0.5, q = -16..15.
  std::vector<uint8_t> q8(32);
  for (int j = 0; j < 32; ++j) q8[j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  w.Tensor("q8", {32}, 8, Block(0x3800, q8));
  // Q4_0: d = 2, byte j = (j % 16) | ((15 - j % 16) << 4).
  std::vector<uint8_t> q4(16);
  for (int j = 0; j < 16; ++j) q4[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  w.Tensor("q4_0", {32}, 2, Block(0x4000, q4));
  // Q4_1: d = 0.5, m = -1, same nibbles.
  const uint16_t m = 0xBC00;
  w.Tensor("q4_1", {32}, 3, Block(0x3800, q4, &m));
  const std::string path = WriteTemp("types.gguf", w.Bytes());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->String("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->Uint("llama.block_count"), 30u);
  EXPECT_EQ(*(*f)->Float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(*(*f)->Strings("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "b", "<s>"}));
  EXPECT_EQ((*f)->String("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*f)->Uint("general.architecture").status().code(), StatusCode::kInvalidArgument);
  auto values = [&](const std::string& name) {
    std::vector<float> out;
    const GgufTensor* t = (*f)->Find(name);
    EXPECT_NE(t, nullptr) << name;
    if (t != nullptr) {
      EXPECT_TRUE((*f)->Dequantize(*t, &out).ok()) << name;
    }
    return out;
  };
  EXPECT_EQ(values("f32"), (std::vector<float>{1.5f, -0.25f}));
  auto h = values("f16");
  ASSERT_EQ(h.size(), 5u);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0.5f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[4]) && h[4] > 0);
  EXPECT_EQ(values("bf16"), (std::vector<float>{1.0f, -3.0f}));
  auto v8 = values("q8");
  auto v40 = values("q4_0");
  auto v41 = values("q4_1");
  ASSERT_EQ(v8.size(), 32u);
  ASSERT_EQ(v40.size(), 32u);
  ASSERT_EQ(v41.size(), 32u);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(v8[j], 0.5f * (j - 16)) << j;
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(v40[j], 2.0f * (j - 8)) << j;
    EXPECT_EQ(v40[j + 16], 2.0f * (15 - j - 8)) << j;
    EXPECT_EQ(v41[j], 0.5f * j - 1.0f) << j;
    EXPECT_EQ(v41[j + 16], 0.5f * (15 - j) - 1.0f) << j;
  }
  (void)RemoveTree(path);
}

// Structural damage is an error that names the file, never a crash or a silent zero.
TEST(GgufTest, DamagedFilesAreRefused) {
  GgufWriter w;
  w.MetaStr("general.architecture", "llama");
  w.Tensor("t", {4}, 0, std::string(16, '\1'));
  const std::string good = w.Bytes();
  auto refuse = [](const std::string& name, const std::string& bytes, const std::string& says) {
    const std::string path = WriteTemp(name, bytes);
    auto f = GgufFile::Open(path);
    EXPECT_FALSE(f.ok()) << name;
    if (!f.ok()) {
      EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status();
      EXPECT_NE(f.status().message().find(says), std::string::npos) << f.status();
    }
    (void)RemoveTree(path);
  };
  refuse("magic", "GGUX" + good.substr(4), "not a GGUF file");
  std::string v1 = good;
  v1[4] = 1;
  refuse("version", v1, "version 1");
  refuse("truncated_data", good.substr(0, good.size() - 4), "beyond the end");
  refuse("truncated_header", good.substr(0, 40), "truncated");
  // A string length of 2^40 bytes.
  std::string huge = good;
  const std::string len = GgufWriter::U64(1ull << 40);
  huge.replace(24, 8, len);
  refuse("huge_string", huge, "bytes long");
  // Two tensors over the same bytes.
  GgufWriter o2;
  o2.Tensor("a", {4}, 0, std::string(16, '\1'));
  o2.Tensor("b", {4}, 0, std::string(16, '\1'));
  std::string two = o2.Bytes();
  // Point b's offset (the last 8 bytes of its info) at a's data.
  const size_t b_info = two.find(std::string("\1\0\0\0\0\0\0\0b", 9));
  ASSERT_NE(b_info, std::string::npos);
  const size_t off = b_info + 9 + 4 + 8 + 4;
  two.replace(off, 8, GgufWriter::U64(8));
  refuse("overlap", two, "overlap");
  // A row that is not whole blocks.
  GgufWriter q;
  q.Tensor("q", {31}, 8, std::string(34, '\0'));
  refuse("partial_block", q.Bytes(), "whole blocks");
  // An unknown type is readable metadata but not dequantisable.
  GgufWriter u;
  u.Tensor("k", {256}, 12, std::string(144, '\0'));
  const std::string upath = WriteTemp("unknown_type.gguf", u.Bytes());
  auto f = GgufFile::Open(upath);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<float> out;
  Status s = (*f)->Dequantize((*f)->tensors()[0], &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("type 12"), std::string::npos) << s;
  (void)RemoveTree(upath);
}

// llama.cpp's RoPE row order for q_proj / k_proj, as its converter applies it (the inverse of
// what ConvertGgufToHf undoes).
at::Tensor PermuteRope(const at::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), cols = w.size(1);
  return w.reshape({heads, 2, rows / heads / 2, cols}).transpose(1, 2).reshape({rows, cols});
}

TEST(GgufTest, ConvertedLlamaLoadsBackTheSameParameters) {
  ModelSpec spec;
  spec.architecture = "llama";
  spec.vocab_size = 8;
  spec.hidden_size = 16;
  spec.num_layers = 2;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 4;
  spec.intermediate_size = 24;
  spec.max_seq_len = 64;
  spec.rope_theta = 50000.0;
  spec.rms_norm_eps = 1e-5;
  spec.tie_embeddings = false;
  auto model = Transformer::Create(spec, 3, 0.5);
  GgufWriter w;
  w.MetaStr("general.architecture", "llama");
  w.MetaU32("llama.embedding_length", 16);
  w.MetaU32("llama.block_count", 2);
  w.MetaU32("llama.attention.head_count", 4);
  w.MetaU32("llama.attention.head_count_kv", 2);
  w.MetaU32("llama.feed_forward_length", 24);
  w.MetaU32("llama.context_length", 64);
  w.MetaF32("llama.rope.freq_base", 50000.0f);
  w.MetaF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.MetaStr("tokenizer.ggml.model", "gpt2");
  w.MetaStr("tokenizer.ggml.pre", "smollm");
  w.MetaStrings("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b", "c", "ab", "1", "2"});
  w.MetaI32s("tokenizer.ggml.token_type", {3, 3, 1, 1, 1, 1, 1, 1});
  w.MetaStrings("tokenizer.ggml.merges", {"a b"});
  w.MetaU32("tokenizer.ggml.bos_token_id", 0);
  w.MetaU32("tokenizer.ggml.eos_token_id", 1);
  w.MetaStr("tokenizer.chat_template", "{{ messages }}");
  const std::map<std::string, std::string> names = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  for (const auto& [name, t] : model->NamedParameters()) {
    std::string g;
    at::Tensor v = t.detach().contiguous();
    if (names.count(name)) {
      g = names.at(name);
    } else {
      const std::string rest = name.substr(std::string("model.layers.").size());
      const std::string layer = rest.substr(0, rest.find('.'));
      const std::string part = rest.substr(rest.find('.') + 1);
      const std::map<std::string, std::string> parts = {
          {"input_layernorm.weight", "attn_norm.weight"},
          {"self_attn.q_proj.weight", "attn_q.weight"},
          {"self_attn.k_proj.weight", "attn_k.weight"},
          {"self_attn.v_proj.weight", "attn_v.weight"},
          {"self_attn.o_proj.weight", "attn_output.weight"},
          {"post_attention_layernorm.weight", "ffn_norm.weight"},
          {"mlp.gate_proj.weight", "ffn_gate.weight"},
          {"mlp.up_proj.weight", "ffn_up.weight"},
          {"mlp.down_proj.weight", "ffn_down.weight"}};
      g = "blk." + layer + "." + parts.at(part);
      if (part == "self_attn.q_proj.weight") v = PermuteRope(v, 4).contiguous();
      if (part == "self_attn.k_proj.weight") v = PermuteRope(v, 2).contiguous();
    }
    std::vector<uint64_t> dims(v.sizes().rbegin(), v.sizes().rend());
    w.Tensor(g, dims, 0, std::string(static_cast<const char*>(v.data_ptr()), v.nbytes()));
  }
  const std::string path = WriteTemp("llama.gguf", w.Bytes());
  const std::string dir = TempDirectory() + "/gyre_gguf_hf_" + std::to_string(::getpid());
  auto conv = ConvertGgufToHf(path, dir);
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_EQ(conv->vocab, 8);
  EXPECT_EQ(conv->tensor_types, "F32 x21");
  auto loaded = LoadHfModel(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const auto want = model->NamedParameters(), got = (*loaded)->NamedParameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i].first, got[i].first);
    EXPECT_TRUE(at::equal(want[i].second, got[i].second)) << want[i].first;
  }
  const std::string cfg = ReadFileToString(dir + "/tokenizer_config.json").value();
  EXPECT_NE(cfg.find("{{ messages }}"), std::string::npos) << cfg;
  EXPECT_NE(cfg.find("\"eos_token\": \"</s>\""), std::string::npos) << cfg;
  // Another architecture is refused by name.
  GgufWriter q;
  q.MetaStr("general.architecture", "qwen2");
  const std::string qpath = WriteTemp("qwen2.gguf", q.Bytes());
  auto bad = ConvertGgufToHf(qpath, dir + "_q");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'qwen2'"), std::string::npos) << bad.status();
  EXPECT_FALSE(PathExists(dir + "_q/config.json"));
  (void)RemoveTree(path);
  (void)RemoveTree(qpath);
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace gyre::model
