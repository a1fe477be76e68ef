#include "model/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/file_util.h"
#include "model/weights.h"
#include "testing/tiny_model.h"

namespace gyre::model {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDirectory() + "/gyre_st_test_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_TRUE(MakeDirs(dir_).ok());
  }
  void TearDown() override { (void)RemoveTree(dir_); }

  // Writes a safetensors file by hand: entries = {name: (dtype, shape, [begin, end])}.
  std::string Write(const std::string& name, const nlohmann::json& header,
                    const std::string& data) {
    std::string h = header.dump();
    while (h.size() % 8) h.push_back(' ');
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary);
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << h << data;
    return path;
  }
  std::string dir_;
};

TEST_F(SafetensorsTest, ReadsHalfAndBfloat16InPlace) {
  at::Tensor h = at::tensor({1.5f, -2.0f, 0.25f}).to(at::kHalf);
  at::Tensor b = at::tensor({3.0f, 0.5f}).to(at::kBFloat16);
  std::string data(reinterpret_cast<const char*>(h.data_ptr()), 6);
  data.append(reinterpret_cast<const char*>(b.data_ptr()), 4);
  const std::string path =
      Write("m.safetensors",
            {{"h", {{"dtype", "F16"}, {"shape", {3}}, {"data_offsets", {0, 6}}}},
             {"b", {{"dtype", "BF16"}, {"shape", {2, 1}}, {"data_offsets", {6, 10}}}},
             {"__metadata__", {{"format", "pt"}}}},
            data);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  auto hv = (*f)->View("h");
  ASSERT_TRUE(hv.ok());
  EXPECT_TRUE(at::equal(hv->to(at::kFloat), at::tensor({1.5f, -2.0f, 0.25f})));
  EXPECT_EQ((*f)->View("b")->sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ((*f)->View("nope").status().code(), StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, CorruptFilesAreErrorsNamingFileAndTensor) {
  const std::string four(16, '\0');
  struct Case {
    nlohmann::json header;
    std::string data, expect;
  };
  std::vector<Case> cases = {
      {{{"t", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}}},
       "abc",
       "tensor 't': byte range [0, 16) lies outside the data section of 3 bytes"},
      {{{"t", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 16}}}}},
       four,
       "tensor 't': shape [3] of F32 needs 12 bytes, the entry has 16"},
      {{{"t", {{"dtype", "Q4"}, {"shape", {4}}, {"data_offsets", {0, 16}}}}},
       four,
       "tensor 't': unknown dtype 'Q4'"},
      {{{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
        {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}},
       four,
       "overlaps another tensor's bytes"},
      {{{"t", {{"dtype", "F32"}, {"shape", {4}}}}}, four, "tensor 't': malformed entry"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path =
        Write("c" + std::to_string(i) + ".safetensors", cases[i].header, cases[i].data);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << "case " << i;
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status();
    EXPECT_NE(f.status().message().find(cases[i].expect), std::string::npos)
        << "case " << i << ": " << f.status();
  }
  // Truncated before the header ends, and a header that is not JSON.
  const std::string trunc = dir_ + "/trunc.safetensors";
  std::ofstream(trunc, std::ios::binary) << std::string("\x40\0\0\0\0\0\0\0{", 9);
  EXPECT_NE(SafetensorsFile::Open(trunc).status().message().find("exceeds the file size"),
            std::string::npos);
  const std::string bad = dir_ + "/bad.safetensors";
  std::ofstream(bad, std::ios::binary) << std::string("\x02\0\0\0\0\0\0\0{x", 10);
  EXPECT_NE(SafetensorsFile::Open(bad).status().message().find("bad JSON header"),
            std::string::npos);
}

// Found by fuzz_safetensors (docs/reliability.md): U16, U32 and U64 tensors opened fine but
// their views came back as bool tensors of the wrong size; now a view of one is an error.
TEST_F(SafetensorsTest, UnsignedWideDtypesOpenButCannotBeViewed) {
  const std::string path =
      Write("u.safetensors",
            {{"u16", {{"dtype", "U16"}, {"shape", {2}}, {"data_offsets", {0, 4}}}},
             {"u32", {{"dtype", "U32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}},
             {"u64", {{"dtype", "U64"}, {"shape", {1}}, {"data_offsets", {8, 16}}}},
             {"i32", {{"dtype", "I32"}, {"shape", {1}}, {"data_offsets", {16, 20}}}}},
            std::string(20, '\x01'));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  for (const char* name : {"u16", "u32", "u64"}) {
    auto v = (*f)->View(name);
    ASSERT_FALSE(v.ok()) << name << " viewed as " << v->dtype();
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find("cannot load"), std::string::npos) << v.status();
  }
  auto i = (*f)->View("i32");
  ASSERT_TRUE(i.ok()) << i.status();
  EXPECT_EQ(i->item<int32_t>(), 0x01010101);
}

// Found by fuzz_safetensors (docs/reliability.md): a dimension too long for 64 bits (read as a
// float by the JSON parser) was converted with undefined behaviour, and a shape whose element
// count wraps past 2^64 matched an empty byte range, then threw out of View (numel overflow).
TEST_F(SafetensorsTest, ShapesThatDoNotFitAreErrors) {
  const std::string huge = "160877777777777777777777777777777777777777";
  const std::string text =
      "{\"t\": {\"dtype\": \"F16\", \"shape\": [" + huge + "], \"data_offsets\": [0, 2]}}";
  const std::string path = dir_ + "/float_dim.safetensors";
  {
    std::string h = text;
    while (h.size() % 8) h.push_back(' ');
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((h.size() >> (8 * i)) & 0xff));
    out << h << std::string(2, '\0');
  }
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("shape must be a list of integers"), std::string::npos)
      << f.status();
  const std::string wraps = Write(
      "wraps.safetensors",
      {{"t", {{"dtype", "F32"}, {"shape", {4294967296, 4294967296}}, {"data_offsets", {0, 0}}}}},
      "");
  auto g = SafetensorsFile::Open(wraps);
  ASSERT_FALSE(g.ok()) << "opened a tensor of 2^64 elements in 0 bytes";
  EXPECT_NE(g.status().message().find("too many elements"), std::string::npos) << g.status();
}

TEST_F(SafetensorsTest, ShardedCheckpointLoadsIntoAModel) {
  auto src = Transformer::Create(testing::TinySpec(20, 16, 2, 2, 1, 24), 1, 0.1);
  auto dst = Transformer::Create(testing::TinySpec(20, 16, 2, 2, 1, 24), 2, 0.1);
  // Split the parameters over two shards written by SaveSafetensors.
  NamedTensors params = src->NamedParameters(), first, second;
  nlohmann::json index;
  for (size_t i = 0; i < params.size(); ++i) {
    (i % 2 ? second : first).push_back(params[i]);
    index["weight_map"][params[i].first] = i % 2 ? "b.safetensors" : "a.safetensors";
  }
  ASSERT_TRUE(SaveSafetensors(dir_ + "/a.safetensors", first).ok());
  ASSERT_TRUE(SaveSafetensors(dir_ + "/b.safetensors", second).ok());
  std::ofstream(dir_ + "/model.safetensors.index.json") << index.dump();
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE(LoadParameters(**ckpt, dst->NamedParameters(), {}).ok());
  auto a = src->NamedParameters(), b = dst->NamedParameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, b[i].second));

  // A model with another shape is refused, naming the tensor, and left untouched.
  auto other = Transformer::Create(testing::TinySpec(20, 16, 2, 2, 1, 32), 3, 0.1);
  auto fresh = Transformer::Create(testing::TinySpec(20, 16, 2, 2, 1, 32), 3, 0.1);
  Status s = LoadParameters(**ckpt, other->NamedParameters(), {});
  EXPECT_NE(s.message().find("mlp.gate_proj.weight' has shape [24, 16]"), std::string::npos) << s;
  auto o = other->NamedParameters(), f = fresh->NamedParameters();
  for (size_t i = 0; i < o.size(); ++i) EXPECT_TRUE(at::equal(o[i].second, f[i].second));
  EXPECT_EQ(Checkpoint::Open(dir_ + "/missing").status().code(), StatusCode::kNotFound);
}

// The writer: half-precision dtypes and sharding with an index that Checkpoint::Open reads.
TEST_F(SafetensorsTest, WritesHalfPrecisionAndShards) {
  auto src = Transformer::Create(testing::TinySpec(20, 16, 2, 2, 1, 24), 1, 0.1);
  auto dst = Transformer::Create(testing::TinySpec(20, 16, 2, 2, 1, 24), 2, 0.1);
  ASSERT_TRUE(SaveCheckpointWeights(dir_, src->NamedParameters(), "BF16", 2048).ok());
  EXPECT_FALSE(PathExists(dir_ + "/model.safetensors"));
  EXPECT_TRUE(PathExists(dir_ + "/model.safetensors.index.json"));
  std::ifstream in(dir_ + "/model.safetensors.index.json");
  auto index = nlohmann::json::parse(in);
  std::set<std::string> files;
  for (const auto& [tensor, file] : index["weight_map"].items()) files.insert(file);
  EXPECT_EQ(index["weight_map"].size(), src->NamedParameters().size());
  EXPECT_GE(files.size(), 2u);
  for (const auto& f : files) EXPECT_TRUE(PathExists(dir_ + "/" + f)) << f;
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->View("model.norm.weight")->scalar_type(), at::kBFloat16);
  ASSERT_TRUE(LoadParameters(**ckpt, dst->NamedParameters(), {}).ok());
  auto a = src->NamedParameters(), b = dst->NamedParameters();
  for (size_t i = 0; i < a.size(); ++i) {
    // bfloat16 keeps 8 significant bits: relative error below 2^-8.
    EXPECT_TRUE(at::allclose(a[i].second, b[i].second, 1.0 / 256, 1e-6)) << a[i].first;
  }
  EXPECT_FALSE(SaveSafetensors(dir_ + "/x.safetensors", src->NamedParameters(), "Q8").ok());
}

// The streaming writer: tensors in the order given (not name order), converted to the file's
// dtype, read back exactly; a wrong tensor is refused; a writer dropped before Finish leaves no
// file.
TEST_F(SafetensorsTest, StreamingWriterWritesInItsOwnOrderAndIsAtomic) {
  const at::Tensor b = at::arange(6, at::kFloat).view({2, 3});
  const at::Tensor a = at::arange(4, at::kDouble) * 0.5;
  const std::string path = dir_ + "/streamed.safetensors";
  {
    auto w = SafetensorsWriter::Create(path, {{"z.b", {2, 3}}, {"a", {4}}});
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->Append("z.b", b).ok());
    EXPECT_FALSE(PathExists(path));  // nothing in place before Finish
    const Status wrong = (*w)->Append("b", a);
    EXPECT_FALSE(wrong.ok());
    EXPECT_NE(wrong.message().find("'a'"), std::string::npos) << wrong.message();
    EXPECT_FALSE((*w)->Finish().ok());  // one of two written
  }
  EXPECT_FALSE(PathExists(path));
  EXPECT_FALSE(PathExists(path + ".tmp"));
  auto w = SafetensorsWriter::Create(path, {{"z.b", {2, 3}}, {"a", {4}}});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append("z.b", b).ok());
  ASSERT_TRUE((*w)->Append("a", a).ok());
  EXPECT_FALSE((*w)->Append("c", a).ok());  // more than the header lists
  ASSERT_TRUE((*w)->Finish().ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->entries().at("z.b").begin, 0u);  // the data follow the order given
  EXPECT_EQ((*f)->entries().at("a").dtype, "F32");
  EXPECT_TRUE(at::equal((*f)->View("z.b").value(), b));
  EXPECT_TRUE(at::equal((*f)->View("a").value(), a.to(at::kFloat)));
}

}  // namespace
}  // namespace gyre::model
