#include "gyre/status.h"

#include <gtest/gtest.h>

namespace gyre {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  GYRE_ASSIGN_OR_RETURN(int h, Half(x));
  GYRE_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(StatusTest, OkAndErrorsPrintTheirCode) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = DataLoss("bucket 3 failed its CRC-32 check");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "DATA_LOSS: bucket 3 failed its CRC-32 check");
  EXPECT_EQ(s.WithContext("rollout-1").message(), "rollout-1: bucket 3 failed its CRC-32 check");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").ok());
}

TEST(StatusTest, MacrosPropagateTheFirstError) {
  int out = 0;
  EXPECT_TRUE(Quarter(12, &out).ok());
  EXPECT_EQ(out, 3);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "3 is odd");
}

TEST(StatusDeathTest, ValueOfAnErrorAbortsWithTheStatusMessage) {
  StatusOr<int> bad = InvalidArgument("config.json: vocab_size must be positive");
  EXPECT_DEATH((void)bad.value(),
               "StatusOr::value\\(\\) called on an error: INVALID_ARGUMENT: config.json: "
               "vocab_size must be positive");
  EXPECT_DEATH((void)*bad, "called on an error");
  StatusOr<std::string> bad_string = NotFound("no such file");
  EXPECT_DEATH((void)bad_string->size(), "NOT_FOUND: no such file");
  StatusOr<int> good = 7;
  EXPECT_EQ(good.value(), 7);
}

}  // namespace
}  // namespace gyre
