// SampleLedger on real SQLite files: the lifecycle, refused moves that change nothing, rollback
// to a checkpoint's sequence, reopening, damaged or foreign files, and a process killed with
// SIGKILL in the middle of its writes.
#include "controller/sample_ledger.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "common/file_util.h"

namespace gyre::controller {
namespace {

using S = SampleState;

// Runs SQL on a database file with SQLite itself (to make files the ledger did not write).
bool RunSql(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  bool ok = sqlite3_open(path.c_str(), &db) == SQLITE_OK &&
            sqlite3_exec(db, sql, nullptr, nullptr, nullptr) == SQLITE_OK;
  sqlite3_close(db);
  return ok;
}

class SampleLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDirectory() + "/gyre_ledger_" + std::to_string(::getpid());
    ASSERT_TRUE(RemoveTree(dir_).ok());
    ASSERT_TRUE(MakeDirs(dir_).ok());
    path_ = dir_ + "/ledger.db";
  }
  void TearDown() override { EXPECT_TRUE(RemoveTree(dir_).ok()); }

  std::unique_ptr<SampleLedger> OpenOrDie(bool create = true) {
    auto l = SampleLedger::Open(path_, create);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? std::move(*l) : nullptr;
  }

  // One group of `n` samples with ids group*100 + i, all from prompt "p<group>".
  static std::vector<NewSample> GroupOf(uint64_t group, int n) {
    std::vector<NewSample> out;
    for (int i = 0; i < n; ++i)
      out.push_back({group * 100 + i, group, "p" + std::to_string(group)});
    return out;
  }
  static std::vector<uint64_t> Ids(uint64_t group, int n) {
    std::vector<uint64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(group * 100 + i);
    return out;
  }
  static MoveContext At(int64_t step, const std::string& worker = "", const std::string& why = "") {
    MoveContext c;
    c.step = step;
    c.version = step;
    c.worker = worker;
    c.reason = why;
    return c;
  }

  std::string dir_;
  std::string path_;
};

TEST(SampleStateTest, AllowedMovesAreTheLifecycleArrows) {
  EXPECT_TRUE(IsAllowedMove(S::kQueued, S::kGenerating));
  EXPECT_TRUE(IsAllowedMove(S::kGenerating, S::kFinished));
  EXPECT_TRUE(IsAllowedMove(S::kGenerating, S::kQueued));  // its worker died
  EXPECT_TRUE(IsAllowedMove(S::kFinished, S::kScored));
  EXPECT_TRUE(IsAllowedMove(S::kScored, S::kTrained));
  EXPECT_TRUE(IsAllowedMove(S::kScored, S::kFiltered));
  EXPECT_TRUE(IsAllowedMove(S::kQueued, S::kDropped));
  EXPECT_FALSE(IsAllowedMove(S::kQueued, S::kFinished));
  EXPECT_FALSE(IsAllowedMove(S::kFinished, S::kTrained));
  EXPECT_FALSE(IsAllowedMove(S::kScored, S::kGenerating));
  for (S final_state : {S::kTrained, S::kFiltered, S::kDropped}) {
    for (int to = 0; to < 7; ++to) EXPECT_FALSE(IsAllowedMove(final_state, static_cast<S>(to)));
  }
  EXPECT_STREQ(SampleStateName(S::kScored), "scored");
}

TEST_F(SampleLedgerTest, SamplesMoveThroughTheLifecycleAndEveryMoveIsAnEvent) {
  auto l = OpenOrDie();
  ASSERT_TRUE(l->Add(GroupOf(1, 4), At(0)).ok());
  ASSERT_TRUE(l->Add(GroupOf(2, 4), At(0)).ok());
  ASSERT_TRUE(l->Move(Ids(1, 4), S::kGenerating, At(0, "rollout-0")).ok());
  ASSERT_TRUE(l->Move(Ids(1, 4), S::kFinished, At(0, "rollout-0")).ok());
  ASSERT_TRUE(l->Move(Ids(1, 4), S::kScored, At(0)).ok());
  ASSERT_TRUE(l->Move({100, 101, 102}, S::kTrained, At(1)).ok());
  ASSERT_TRUE(l->Move({103}, S::kFiltered, At(1, "", "zero reward variance")).ok());
  ASSERT_TRUE(l->Move(Ids(2, 4), S::kGenerating, At(1, "rollout-1")).ok());
  ASSERT_TRUE(l->Move({200, 201}, S::kQueued, At(1, "rollout-1", "worker died")).ok());

  auto c = l->Counts();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->total, 8);
  EXPECT_EQ(c->of(S::kTrained), 3);
  EXPECT_EQ(c->of(S::kFiltered), 1);
  EXPECT_EQ(c->of(S::kGenerating), 2);
  EXPECT_EQ(c->of(S::kQueued), 2);

  auto r = l->Find(103);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->group_id, 1u);
  EXPECT_EQ(r->prompt, "p1");
  EXPECT_EQ(r->state, S::kFiltered);
  EXPECT_EQ(r->last.reason, "zero reward variance");
  EXPECT_EQ(r->last.step, 1);
  EXPECT_EQ(l->Find(999).status().code(), StatusCode::kNotFound);

  auto h = l->History(200);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), 3u);
  EXPECT_FALSE((*h)[0].has_from);
  EXPECT_EQ((*h)[0].to, S::kQueued);
  EXPECT_EQ((*h)[1].to, S::kGenerating);
  EXPECT_EQ((*h)[1].context.worker, "rollout-1");
  EXPECT_EQ((*h)[2].from, S::kGenerating);
  EXPECT_EQ((*h)[2].to, S::kQueued);
  EXPECT_LT((*h)[0].sequence, (*h)[1].sequence);

  auto queued = l->InState(S::kQueued);
  ASSERT_TRUE(queued.ok());
  ASSERT_EQ(queued->size(), 2u);
  EXPECT_EQ((*queued)[0].sample_id, 200u);
  auto group = l->Group(2);
  ASSERT_TRUE(group.ok());
  EXPECT_EQ(group->size(), 4u);

  auto use = l->PromptUsage();
  ASSERT_TRUE(use.ok()) << use.status();
  ASSERT_EQ(use->size(), 2u);
  EXPECT_EQ((*use)[0].prompt, "p1");
  EXPECT_EQ((*use)[0].samples, 4);
  EXPECT_EQ((*use)[0].trained, 3);
  EXPECT_EQ((*use)[0].filtered, 1);
  EXPECT_EQ((*use)[1].trained, 0);
  auto last = l->LastSequence();
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(*last, 8 + 4 * 3 + 3 + 1 + 4 + 2);  // one event per sample per move
}

TEST_F(SampleLedgerTest, ARefusedCallChangesNothing) {
  auto l = OpenOrDie();
  ASSERT_TRUE(l->Add(GroupOf(1, 3), At(0)).ok());
  const int64_t before = *l->LastSequence();
  // 101 cannot finish before it generates: the whole call fails, 100 does not move either.
  ASSERT_TRUE(l->Move({100}, S::kGenerating, At(0)).ok());
  Status s = l->Move({100, 101}, S::kFinished, At(0));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "sample 101 cannot move from queued to finished");
  EXPECT_EQ(l->Find(100)->state, S::kGenerating);
  EXPECT_EQ(*l->LastSequence(), before + 1);
  // Unknown ids, ids twice, drops without a reason, a sample added twice.
  EXPECT_EQ(l->Move({100, 555}, S::kFinished, At(0)).code(), StatusCode::kNotFound);
  EXPECT_EQ(l->Move({100, 100}, S::kFinished, At(0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(l->Move({101}, S::kDropped, At(0)).code(), StatusCode::kInvalidArgument);
  Status dup = l->Add({{7, 9, "q"}, {102, 1, "p1"}}, At(0));
  EXPECT_EQ(dup.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(dup.message(), "sample 102 is already in the ledger (queued)");
  EXPECT_EQ(l->Find(7).status().code(), StatusCode::kNotFound);  // the first one was not added
  EXPECT_EQ(l->Add({{8, 9, "q"}, {8, 9, "q"}}, At(0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(l->Add({{8, 9, ""}}, At(0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(l->Move({100}, S::kFinished, At(0)).code(), StatusCode::kOk);
  EXPECT_EQ(*l->LastSequence(), before + 2);
  EXPECT_EQ(l->Counts()->total, 3);
}

TEST_F(SampleLedgerTest, DropUnendedEndsEveryOpenSampleAndLeavesEndedOnesAlone) {
  auto l = OpenOrDie();
  ASSERT_TRUE(l->Add(GroupOf(1, 5), At(0)).ok());
  // 100 trained, 101 filtered, 102 scored, 103 generating, 104 still queued.
  ASSERT_TRUE(l->Move({100, 101, 102, 103}, S::kGenerating, At(0, "rollout-0")).ok());
  ASSERT_TRUE(l->Move({100, 101, 102}, S::kFinished, At(0)).ok());
  ASSERT_TRUE(l->Move({100, 101, 102}, S::kScored, At(0)).ok());
  ASSERT_TRUE(l->Move({100}, S::kTrained, At(1)).ok());
  ASSERT_TRUE(l->Move({101}, S::kFiltered, At(1, "", "zero variance")).ok());
  // A reason is required, and a refused call moves nothing.
  EXPECT_EQ(l->DropUnended(At(2)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(l->Find(104)->state, S::kQueued);
  auto moved = l->DropUnended(At(2, "", "the job ended"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, 3);
  const LedgerCounts c = *l->Counts();
  EXPECT_EQ(c.of(S::kTrained), 1);
  EXPECT_EQ(c.of(S::kFiltered), 1);
  EXPECT_EQ(c.of(S::kDropped), 3);
  EXPECT_EQ(l->History(103)->back().context.reason, "the job ended");
  EXPECT_EQ(*l->DropUnended(At(2, "", "again")), 0);  // nothing left open
}

TEST_F(SampleLedgerTest, RollbackToACheckpointForgetsWhatCameAfterIt) {
  auto l = OpenOrDie();
  ASSERT_TRUE(l->Add(GroupOf(1, 2), At(0)).ok());
  ASSERT_TRUE(l->Move(Ids(1, 2), S::kGenerating, At(0)).ok());
  const int64_t checkpoint = *l->LastSequence();
  ASSERT_TRUE(l->Move(Ids(1, 2), S::kFinished, At(0)).ok());
  ASSERT_TRUE(l->Add(GroupOf(2, 2), At(1)).ok());  // new after the checkpoint
  ASSERT_TRUE(l->Move(Ids(1, 2), S::kScored, At(1)).ok());
  ASSERT_TRUE(l->RollbackTo(checkpoint).ok());
  EXPECT_EQ(*l->LastSequence(), checkpoint);
  EXPECT_EQ(l->Find(100)->state, S::kGenerating);
  EXPECT_EQ(l->Find(200).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(l->Counts()->total, 2);
  EXPECT_EQ(l->History(101)->size(), 2u);
  // The same moves again after the rollback are allowed (the resumed run repeats them).
  EXPECT_TRUE(l->Move(Ids(1, 2), S::kFinished, At(0)).ok());
  EXPECT_TRUE(l->Add(GroupOf(2, 2), At(1)).ok());
  // A checkpoint ahead of the ledger, or a negative sequence, is refused.
  EXPECT_EQ(l->RollbackTo(*l->LastSequence() + 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(l->RollbackTo(-1).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(l->RollbackTo(0).ok());
  EXPECT_EQ(l->Counts()->total, 0);
}

TEST_F(SampleLedgerTest, ReopenedLedgerHasEverythingAndIdsKeepAll64Bits) {
  const uint64_t big = (uint64_t{1} << 63) + 5;  // evaluation group ids live up here
  {
    auto l = OpenOrDie();
    ASSERT_TRUE(l->Add({{big, big, "eval:5"}, {1, 2, "p"}}, At(3)).ok());
    ASSERT_TRUE(l->Move({big}, S::kGenerating, At(3, "rollout-0")).ok());
  }
  auto l = OpenOrDie(/*create=*/false);
  auto r = l->Find(big);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sample_id, big);
  EXPECT_EQ(r->group_id, big);
  EXPECT_EQ(r->state, S::kGenerating);
  EXPECT_EQ(r->last.worker, "rollout-0");
  EXPECT_EQ(l->Counts()->total, 2);
}

TEST_F(SampleLedgerTest, MissingForeignAndDamagedFilesAreClearErrors) {
  auto missing = SampleLedger::Open(dir_ + "/none.db", false);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "sample ledger " + dir_ + "/none.db does not exist");
  EXPECT_FALSE(PathExists(dir_ + "/none.db"));
  EXPECT_EQ(SampleLedger::Open(dir_, true).status().code(), StatusCode::kInvalidArgument);

  const std::string text = dir_ + "/text.db";
  ASSERT_TRUE(WriteFileAtomic(text, std::string(4096, 'x')).ok());
  auto not_db = SampleLedger::Open(text, true);
  ASSERT_FALSE(not_db.ok());
  EXPECT_EQ(not_db.status().code(), StatusCode::kDataLoss) << not_db.status();
  EXPECT_EQ(not_db.status().message().rfind(text + ": ", 0), 0u) << not_db.status();
  EXPECT_EQ(*ReadFileToString(text), std::string(4096, 'x'));  // unchanged

  // Another program's SQLite database, and a ledger from a newer format.
  const std::string other = dir_ + "/other.db";
  ASSERT_TRUE(RunSql(other, "CREATE TABLE t(x INTEGER); INSERT INTO t VALUES (1);"));
  auto foreign = SampleLedger::Open(other, false);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().message(),
            other + ": an SQLite database, but not a Gyre sample ledger");
  {
    auto l = OpenOrDie();
    ASSERT_TRUE(l->Add(GroupOf(1, 1), At(0)).ok());
  }
  ASSERT_TRUE(RunSql(path_, "UPDATE meta SET value = '99' WHERE key = 'format_version';"));
  auto newer = SampleLedger::Open(path_, false);
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.status().message().find("format version 99"), std::string::npos)
      << newer.status();
  // A damaged header: the ledger says so and does not overwrite the file.
  ASSERT_TRUE(RunSql(path_, "UPDATE meta SET value = '1' WHERE key = 'format_version';"));
  ASSERT_TRUE(OpenOrDie(false) != nullptr);
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("Not a database!!", 16);
  }
  auto damaged = SampleLedger::Open(path_, false);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), StatusCode::kDataLoss) << damaged.status();
  EXPECT_EQ(ReadFileToString(path_)->substr(0, 16), "Not a database!!");
}

// A writer killed with SIGKILL at a random moment: reopened, the ledger is exactly as of some
// completed call (every sample in one state, one event per move, no half-applied call).
TEST_F(SampleLedgerTest, AWriterKilledMidWayLeavesTheLastCompletedCall) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3; ++trial) {
    ASSERT_TRUE(RemoveTree(dir_).ok());
    ASSERT_TRUE(MakeDirs(dir_).ok());
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(ready[0]);
      auto l = SampleLedger::Open(path_, true);
      if (!l.ok()) ::_exit(3);
      for (uint64_t g = 1;; ++g) {
        // Each call moves a whole group of 8, so a torn call would show as a split group.
        if (!(*l)->Add(GroupOf(g, 8), At(g)).ok()) ::_exit(4);
        if (!(*l)->Move(Ids(g, 8), S::kGenerating, At(g)).ok()) ::_exit(5);
        if (g == 3) {
          char c = 1;
          if (::write(ready[1], &c, 1) != 1) ::_exit(6);
        }
      }
    }
    ::close(ready[1]);
    char c;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    ::usleep(std::uniform_int_distribution<int>(0, 200000)(rng));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status));

    auto l = OpenOrDie(/*create=*/false);
    ASSERT_NE(l, nullptr);
    auto counts = l->Counts();
    ASSERT_TRUE(counts.ok()) << counts.status();
    ASSERT_GE(counts->total, 24);
    EXPECT_EQ(counts->total % 8, 0);
    EXPECT_EQ(counts->of(S::kQueued) % 8, 0);
    EXPECT_LE(counts->of(S::kQueued), 8);  // at most the last group was added but not moved
    const int64_t groups = counts->total / 8;
    EXPECT_EQ(*l->LastSequence(), counts->total + counts->of(S::kGenerating));
    for (uint64_t g = 1; g <= static_cast<uint64_t>(groups); ++g) {
      auto members = l->Group(g);
      ASSERT_TRUE(members.ok());
      ASSERT_EQ(members->size(), 8u) << "group " << g;
      for (const auto& m : *members) EXPECT_EQ(m.state, (*members)[0].state) << "group " << g;
    }
  }
}

}  // namespace
}  // namespace gyre::controller
