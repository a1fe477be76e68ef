#include "model/weights.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "common/file_util.h"
#include "testing/tiny_model.h"

namespace gyre::model {
namespace {

ModelSpec Spec() { return testing::TinySpec(20, 16, 1, 2, 1, 24); }

std::string TempPath(const std::string& name) {
  const std::string dir = TempDirectory() + "/gyre_weights_test_" + std::to_string(::getpid());
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir + "/" + name;
}

void ExpectSameParameters(const Transformer& a, const Transformer& b) {
  auto pa = a.NamedParameters(), pb = b.NamedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
}

TEST(WeightsTest, FlatRoundTripCopiesEveryParameter) {
  auto src = Transformer::Create(Spec(), 1, 0.1);
  auto dst = Transformer::Create(Spec(), 2, 0.1);
  std::vector<TensorEntry> manifest;
  auto bytes = FlattenParameters(src->NamedParameters(), &manifest);
  EXPECT_EQ(bytes.size(), static_cast<size_t>(src->NumParameters()) * 4);
  ASSERT_TRUE(
      LoadFlatParameters(manifest, bytes.data(), bytes.size(), dst->NamedParameters()).ok());
  ExpectSameParameters(*src, *dst);
}

// model.dtype: bfloat16: a float32 (master) model publishes a bfloat16 payload of half the bytes,
// a bfloat16 model loads it exactly (the same rounding the cast makes), and a float32 model
// loads it widened. Manifests with a dtype that is not a weight dtype, or with float32's sizes
// for a bfloat16 payload, are refused and change nothing.
TEST(WeightsTest, Bfloat16PayloadsHalveTheBytesAndLoadIntoEitherDtype) {
  auto master = Transformer::Create(Spec(), 1, 0.1);
  std::vector<TensorEntry> manifest;
  const auto bytes = FlattenParameters(master->NamedParameters(), &manifest, at::kBFloat16);
  EXPECT_EQ(bytes.size(), static_cast<size_t>(master->NumParameters()) * 2);
  EXPECT_EQ(manifest[0].dtype, "bfloat16");
  uint64_t total = 0;
  const auto again = ParameterManifest(master->NamedParameters(), &total, at::kBFloat16);
  EXPECT_EQ(total, bytes.size());
  EXPECT_EQ(again.back().offset + again.back().nbytes, total);
  auto rollout = Transformer::Create(Spec(), 2, 0.1);
  rollout->ToDtype(at::kBFloat16);
  ASSERT_TRUE(
      LoadFlatParameters(manifest, bytes.data(), bytes.size(), rollout->NamedParameters()).ok());
  auto wide = Transformer::Create(Spec(), 3, 0.1);
  ASSERT_TRUE(
      LoadFlatParameters(manifest, bytes.data(), bytes.size(), wide->NamedParameters()).ok());
  const auto pm = master->NamedParameters(), pr = rollout->NamedParameters(),
             pw = wide->NamedParameters();
  for (size_t i = 0; i < pm.size(); ++i) {
    const at::Tensor rounded = pm[i].second.detach().to(at::kBFloat16);
    EXPECT_TRUE(at::equal(pr[i].second, rounded)) << pm[i].first;
    EXPECT_TRUE(at::equal(pw[i].second, rounded.to(at::kFloat))) << pm[i].first;
  }
  // A bfloat16 model's own payload (the relay) is bfloat16 too, byte for byte the same.
  std::vector<TensorEntry> relayed;
  EXPECT_EQ(FlattenParameters(rollout->NamedParameters(), &relayed, rollout->dtype()), bytes);

  auto before = Transformer::Create(Spec(), 2, 0.1);
  before->ToDtype(at::kBFloat16);
  auto bad = manifest;
  bad[1].dtype = "int8";
  Status s = LoadFlatParameters(bad, bytes.data(), bytes.size(), before->NamedParameters());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dtype 'int8'"), std::string::npos) << s;
  bad = manifest;
  bad[1].dtype = "float32";  // float32 needs twice the bytes the entry has
  s = LoadFlatParameters(bad, bytes.data(), bytes.size(), before->NamedParameters());
  EXPECT_NE(s.message().find(manifest[1].name), std::string::npos) << s;
  auto untouched = Transformer::Create(Spec(), 2, 0.1);
  untouched->ToDtype(at::kBFloat16);
  ExpectSameParameters(*untouched, *before);
  EXPECT_EQ(ParseWeightDtype("BF16").value(), at::kBFloat16);
  EXPECT_FALSE(ParseWeightDtype("float64").ok());
}

TEST(WeightsTest, MismatchedManifestIsRejectedAndChangesNothing) {
  auto src = Transformer::Create(Spec(), 1, 0.1);
  auto dst = Transformer::Create(Spec(), 2, 0.1);
  auto before = Transformer::Create(Spec(), 2, 0.1);
  std::vector<TensorEntry> manifest;
  auto bytes = FlattenParameters(src->NamedParameters(), &manifest);

  auto bad_shape = manifest;
  bad_shape[3].shape = {1, 2, 3};
  Status s = LoadFlatParameters(bad_shape, bytes.data(), bytes.size(), dst->NamedParameters());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(manifest[3].name), std::string::npos) << s.message();

  auto missing = manifest;
  missing.pop_back();
  s = LoadFlatParameters(missing, bytes.data(), bytes.size(), dst->NamedParameters());
  EXPECT_NE(s.message().find("missing tensor 'model.norm.weight'"), std::string::npos) << s;

  s = LoadFlatParameters(manifest, bytes.data(), bytes.size() - 4, dst->NamedParameters());
  EXPECT_FALSE(s.ok());
  ExpectSameParameters(*before, *dst);
}

TEST(WeightsTest, SafetensorsRoundTripAndHeaderLayout) {
  auto src = Transformer::Create(Spec(), 1, 0.1);
  auto dst = Transformer::Create(Spec(), 2, 0.1);
  const std::string path = TempPath("model.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, src->NamedParameters()).ok());
  std::ifstream in(path, std::ios::binary);
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(le[i]) << (8 * i);
  EXPECT_EQ(hlen % 8, 0u);
  EXPECT_EQ(*FileSize(path), 8 + hlen + src->NumParameters() * 4);
  ASSERT_TRUE(LoadSafetensors(path, dst->NamedParameters()).ok());
  ExpectSameParameters(*src, *dst);
}

TEST(WeightsTest, CorruptSafetensorsAreClearErrors) {
  auto src = Transformer::Create(Spec(), 1, 0.1);
  auto dst = Transformer::Create(Spec(), 2, 0.1);
  const std::string path = TempPath("corrupt.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, src->NamedParameters()).ok());
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(*FileSize(path) - 10)), 0);
  Status s = LoadSafetensors(path, dst->NamedParameters());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path), std::string::npos);

  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const unsigned char le[8] = {5, 0, 0, 0, 0, 0, 0, 0};
    out.write(reinterpret_cast<const char*>(le), 8);
    out << "{bad}";
  }
  s = LoadSafetensors(path, dst->NamedParameters());
  EXPECT_NE(s.message().find("bad JSON header"), std::string::npos) << s;
  EXPECT_EQ(LoadSafetensors(TempPath("nope.safetensors"), dst->NamedParameters()).code(),
            StatusCode::kNotFound);
  auto fresh = Transformer::Create(Spec(), 2, 0.1);
  ExpectSameParameters(*fresh, *dst);
}

TEST(WeightsTest, Crc32MatchesTheStandardCheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(Crc32(reinterpret_cast<const uint8_t*>(s.data()), s.size()), 0xCBF43926u);
}

}  // namespace
}  // namespace gyre::model
