#include "model/cpu_decode.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "testing/tensor_compare.h"

namespace gyre::model {
namespace {

struct Shape {
  int64_t heads, kv_heads, head_dim, block_size;
};

// The kernel against scaled_dot_product_attention over the same keys and values gathered into
// dense tensors: sequences of lengths 1 .. a few blocks, block tables in shuffled order (a
// kernel that ignored the table would read another sequence's keys), only some rows decoding
// and in another order than the query rows.
void ExpectMatchesDenseAttention(const Shape& s) {
  at::manual_seed(7);
  const int64_t num_blocks = 40, rows_total = 9;
  const std::vector<int64_t> lens = {1, 5, s.block_size, s.block_size + 1, 3 * s.block_size - 2};
  const std::vector<int64_t> rows = {6, 0, 8, 3, 4};  // the query/output row of each sequence
  const int64_t D = static_cast<int64_t>(lens.size());
  const int64_t max_blocks = 3;
  at::Tensor k_blocks = at::randn({num_blocks, s.block_size, s.kv_heads, s.head_dim});
  at::Tensor v_blocks = at::randn({num_blocks, s.block_size, s.kv_heads, s.head_dim});
  at::Tensor tables = at::randperm(num_blocks).narrow(0, 0, D * max_blocks).view({D, max_blocks});
  at::Tensor q = 2 * at::randn({rows_total, s.heads * s.head_dim});
  at::Tensor lens_t = at::tensor(lens);
  at::Tensor rows_t = at::tensor(rows);
  const float marker = 12345.0f;  // rows that no sequence owns stay untouched
  at::Tensor out = at::full({rows_total, s.heads * s.head_dim}, marker);

  PagedDecodeAttentionArgs a;
  a.rows = rows_t.data_ptr<int64_t>();
  a.q = q.data_ptr<float>();
  a.q_row_stride = s.heads * s.head_dim;
  a.k_blocks = k_blocks.data_ptr<float>();
  a.v_blocks = v_blocks.data_ptr<float>();
  a.tables = tables.data_ptr<int64_t>();
  a.table_stride = max_blocks;
  a.lens = lens_t.data_ptr<int64_t>();
  a.out = out.data_ptr<float>();
  a.num_seqs = D;
  a.num_heads = s.heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.block_size = s.block_size;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  PagedDecodeAttention(a);

  for (int64_t d = 0; d < D; ++d) {
    const int64_t len = lens[static_cast<size_t>(d)];
    auto dense = [&](const at::Tensor& blocks) {  // [1, kv_heads, len, head_dim]
      return blocks.index_select(0, tables[d])
          .reshape({max_blocks * s.block_size, s.kv_heads, s.head_dim})
          .narrow(0, 0, len)
          .transpose(0, 1)
          .unsqueeze(0);
    };
    at::Tensor qd = q[rows[static_cast<size_t>(d)]].view({1, s.heads, 1, s.head_dim});
    at::Tensor want = at::scaled_dot_product_attention(qd, dense(k_blocks), dense(v_blocks), {},
                                                       0.0, false, std::nullopt,
                                                       /*enable_gqa=*/true)
                          .reshape({s.heads * s.head_dim});
    EXPECT_TRUE(testing::AllClose(out[rows[static_cast<size_t>(d)]], want,
                                  {/*rtol=*/1e-5, /*atol=*/1e-6, /*srtol=*/1e-5}))
        << "sequence " << d << " (length " << len << ")";
  }
  for (int64_t r : {1, 2, 5, 7}) {
    EXPECT_TRUE(at::equal(out[r], at::full({s.heads * s.head_dim}, marker)))
        << "row " << r << " belongs to no sequence but was written";
  }
}

TEST(PagedDecodeAttentionTest, GroupedQueryHeadsMatchDenseAttention) {
  ExpectMatchesDenseAttention({/*heads=*/9, /*kv_heads=*/3, /*head_dim=*/64, /*block_size=*/16});
}

TEST(PagedDecodeAttentionTest, OneKeyValueHeadPerQueryHeadMatchesDenseAttention) {
  ExpectMatchesDenseAttention({4, 4, 32, 8});
}

TEST(PagedDecodeAttentionTest, HeadSizesThatAreNotMultiplesOfEightMatchDenseAttention) {
  ExpectMatchesDenseAttention({6, 2, 12, 4});
}

}  // namespace
}  // namespace gyre::model
