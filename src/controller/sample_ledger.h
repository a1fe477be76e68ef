#pragma once
// SampleLedger: the one place that knows where every training sample is (docs/design.md, "The
// sample ledger"). Each sample id moves
//
//   queued -> generating -> finished -> scored -> trained
//
// or ends filtered or dropped with a reason; a generating sample whose worker died goes back to
// queued. Every move is an event with a sequence number; a sample's state is that of its last
// event. The ledger lives in an SQLite database in WAL mode (one file plus its -wal/-shm
// companions): each call below is one transaction, durable when it returns (synchronous=FULL),
// so a controller killed at any moment leaves the ledger as of its last completed call. A
// checkpoint records LastSequence(); resuming from it calls RollbackTo(that sequence), which
// forgets the later events, so the samples the checkpoint did not see are neither lost nor
// counted twice.
//
// Thread contract: every method may be called from any thread; calls are serialised by an
// internal mutex. One process opens a given file at a time (a second Open of a file that is in
// use waits for SQLite's lock up to 5 s, then fails).

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gyre/status.h"

struct sqlite3;

namespace gyre::controller {

enum class SampleState : int {
  kQueued = 0,
  kGenerating = 1,
  kFinished = 2,
  kScored = 3,
  kTrained = 4,
  kFiltered = 5,
  kDropped = 6,
};

// "queued", "generating", ...
const char* SampleStateName(SampleState s);
// Whether a sample in `from` may move to `to` (the arrows above; filtered and dropped from any
// state that is not final; generating back to queued).
bool IsAllowedMove(SampleState from, SampleState to);

// A sample entering the ledger (state queued).
struct NewSample {
  uint64_t sample_id = 0;
  uint64_t group_id = 0;
  std::string prompt;  // where the prompt came from, e.g. "data/train.jsonl:12" or "task:345"
};

// What is known about the moment of a move.
struct MoveContext {
  int64_t step = -1;     // the job's GRPO step, -1 = none
  int64_t version = -1;  // the trainer's policy version, -1 = none
  std::string worker;    // e.g. "rollout-1"; empty = none
  std::string reason;    // required for filtered and dropped
};

struct SampleRecord {
  uint64_t sample_id = 0;
  uint64_t group_id = 0;
  std::string prompt;
  SampleState state = SampleState::kQueued;
  int64_t sequence = 0;  // of the last event
  MoveContext last;      // that event's context
};

struct LedgerEvent {
  int64_t sequence = 0;
  uint64_t sample_id = 0;
  bool has_from = false;  // false for the event that queued the sample
  SampleState from = SampleState::kQueued;
  SampleState to = SampleState::kQueued;
  MoveContext context;
};

struct LedgerCounts {
  int64_t by_state[7] = {0, 0, 0, 0, 0, 0, 0};  // indexed by SampleState
  int64_t total = 0;
  int64_t of(SampleState s) const { return by_state[static_cast<int>(s)]; }
};

// How often the samples of one prompt were trained.
struct PromptUse {
  std::string prompt;
  int64_t samples = 0;
  int64_t trained = 0;
  int64_t filtered = 0;
  int64_t dropped = 0;
};

class SampleLedger {
 public:
  // Opens the ledger at `path`, creating it (and nothing else: the directory must exist) when
  // `create` is true and the file is missing. A file that is not a Gyre ledger, or one written
  // by a newer format, is an error naming the path.
  static StatusOr<std::unique_ptr<SampleLedger>> Open(const std::string& path, bool create);
  ~SampleLedger();
  SampleLedger(const SampleLedger&) = delete;
  SampleLedger& operator=(const SampleLedger&) = delete;

  const std::string& path() const { return path_; }

  // Adds the samples as queued. An id already in the ledger (or twice in `samples`) fails the
  // call and adds none of them.
  Status Add(const std::vector<NewSample>& samples, const MoveContext& context);

  // Moves every sample in `ids` to `to`. A move that is not allowed, an unknown id, or a
  // filtered/dropped move without a reason fails the whole call: no sample moves.
  Status Move(const std::vector<uint64_t>& ids, SampleState to, const MoveContext& context);

  // Ends every sample that has not ended (queued, generating, finished or scored) as dropped,
  // with `context.reason` (required), in one call; returns how many moved.
  StatusOr<int64_t> DropUnended(const MoveContext& context);

  // The sequence number of the newest event (0 for an empty ledger).
  StatusOr<int64_t> LastSequence();

  // Forgets every event after `sequence` and the samples that had no event by then; each other
  // sample takes the state of its last remaining event. `sequence` beyond LastSequence() is an
  // error (a checkpoint cannot be ahead of its ledger).
  Status RollbackTo(int64_t sequence);

  StatusOr<SampleRecord> Find(uint64_t sample_id);  // NotFound for an unknown id
  StatusOr<std::vector<LedgerEvent>> History(uint64_t sample_id);
  StatusOr<std::vector<SampleRecord>> InState(SampleState state);
  StatusOr<std::vector<SampleRecord>> Group(uint64_t group_id);
  StatusOr<LedgerCounts> Counts();
  // Every prompt, most trained first (then by name).
  StatusOr<std::vector<PromptUse>> PromptUsage();

 private:
  SampleLedger(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}

  std::string path_;
  sqlite3* db_;
  std::mutex mu_;
};

}  // namespace gyre::controller
