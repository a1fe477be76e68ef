#include "controller/sample_ledger.h"

#include <sqlite3.h>

#include <algorithm>
#include <set>
#include <unordered_set>
#include <utility>

#include "common/file_util.h"

namespace gyre::controller {
namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kMagic = "gyre-sample-ledger";
constexpr int kStates = 7;

// Sample and group ids are unsigned 64-bit; SQLite integers are signed. Stored bit for bit.
int64_t ToDb(uint64_t v) { return static_cast<int64_t>(v); }
uint64_t FromDb(int64_t v) { return static_cast<uint64_t>(v); }

bool ValidState(int64_t s) { return s >= 0 && s < kStates; }

// One prepared statement; reset and finalised by its destructor.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& Bind(int i, int64_t v) {
    if (ok()) rc_ = sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    if (ok())
      rc_ = sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindNull(int i) {
    if (ok()) rc_ = sqlite3_bind_null(stmt_, i);
    return *this;
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() {
    if (!ok()) return rc_;
    return sqlite3_step(stmt_);
  }
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string Text(int col) const {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? std::string(reinterpret_cast<const char*>(t), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

Status SqlError(sqlite3* db, const std::string& path, const std::string& what) {
  const int code = sqlite3_errcode(db);
  const std::string msg = path + ": " + what + ": " + sqlite3_errmsg(db);
  if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) return DataLoss(msg);
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) return Unavailable(msg);
  return Internal(msg);
}

Status Exec(sqlite3* db, const std::string& path, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string what = err ? err : "error";
    sqlite3_free(err);
    return SqlError(db, path, what);
  }
  return Status::Ok();
}

// Rolls back unless Commit() ran.
class Transaction {
 public:
  Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {
    begun_ = Exec(db, path, "BEGIN IMMEDIATE");
  }
  ~Transaction() {
    if (begun_.ok() && !done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  const Status& begun() const { return begun_; }
  Status Commit() {
    done_ = true;
    Status s = Exec(db_, path_, "COMMIT");
    if (!s.ok()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return s;
  }

 private:
  sqlite3* db_;
  const std::string& path_;
  Status begun_;
  bool done_ = false;
};

void BindContext(Stmt& st, int first, const MoveContext& c) {
  st.Bind(first, c.step).Bind(first + 1, c.version);
  if (c.worker.empty()) {
    st.BindNull(first + 2);
  } else {
    st.Bind(first + 2, c.worker);
  }
  if (c.reason.empty()) {
    st.BindNull(first + 3);
  } else {
    st.Bind(first + 3, c.reason);
  }
}

MoveContext ReadContext(const Stmt& st, int first) {
  MoveContext c;
  c.step = st.Int(first);
  c.version = st.Int(first + 1);
  c.worker = st.Text(first + 2);
  c.reason = st.Text(first + 3);
  return c;
}

constexpr const char* kInsertEvent =
    "INSERT INTO events(sample_id, from_state, to_state, step, version, worker, reason) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)";

// Runs kInsertEvent for one move (from < 0: the sample enters the ledger) and returns the new
// event's sequence number.
StatusOr<int64_t> RecordEvent(sqlite3* db, const std::string& path, Stmt& insert, uint64_t id,
                              int64_t from, SampleState to, const MoveContext& context) {
  insert.Reset();
  insert.Bind(1, ToDb(id));
  if (from < 0) {
    insert.BindNull(2);
  } else {
    insert.Bind(2, from);
  }
  insert.Bind(3, static_cast<int64_t>(to));
  BindContext(insert, 4, context);
  if (insert.Step() != SQLITE_DONE) return SqlError(db, path, "cannot record an event");
  return sqlite3_last_insert_rowid(db);
}

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples(
  sample_id INTEGER PRIMARY KEY,
  group_id INTEGER NOT NULL,
  prompt TEXT NOT NULL,
  state INTEGER NOT NULL,
  seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS samples_by_group ON samples(group_id);
CREATE INDEX IF NOT EXISTS samples_by_state ON samples(state);
CREATE TABLE IF NOT EXISTS events(
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  sample_id INTEGER NOT NULL,
  from_state INTEGER,
  to_state INTEGER NOT NULL,
  step INTEGER NOT NULL,
  version INTEGER NOT NULL,
  worker TEXT,
  reason TEXT);
CREATE INDEX IF NOT EXISTS events_by_sample ON events(sample_id, seq);
)sql";

// The columns of a SampleRecord joined with its last event, in this order.
constexpr const char* kRecordColumns =
    "s.sample_id, s.group_id, s.prompt, s.state, s.seq, e.step, e.version, e.worker, e.reason";

StatusOr<SampleRecord> ReadRecord(const Stmt& st, const std::string& path) {
  SampleRecord r;
  r.sample_id = FromDb(st.Int(0));
  r.group_id = FromDb(st.Int(1));
  r.prompt = st.Text(2);
  const int64_t state = st.Int(3);
  if (!ValidState(state)) {
    return DataLoss(path + ": sample " + std::to_string(r.sample_id) + " has an unknown state " +
                    std::to_string(state));
  }
  r.state = static_cast<SampleState>(state);
  r.sequence = st.Int(4);
  r.last = ReadContext(st, 5);
  return r;
}

}  // namespace

const char* SampleStateName(SampleState s) {
  switch (s) {
    case SampleState::kQueued:
      return "queued";
    case SampleState::kGenerating:
      return "generating";
    case SampleState::kFinished:
      return "finished";
    case SampleState::kScored:
      return "scored";
    case SampleState::kTrained:
      return "trained";
    case SampleState::kFiltered:
      return "filtered";
    case SampleState::kDropped:
      return "dropped";
  }
  return "?";
}

bool IsAllowedMove(SampleState from, SampleState to) {
  using S = SampleState;
  const bool final_state = from == S::kTrained || from == S::kFiltered || from == S::kDropped;
  if (final_state) return false;
  if (to == S::kFiltered || to == S::kDropped) return true;
  switch (from) {
    case S::kQueued:
      return to == S::kGenerating;
    case S::kGenerating:
      return to == S::kFinished || to == S::kQueued;
    case S::kFinished:
      return to == S::kScored;
    case S::kScored:
      return to == S::kTrained;
    default:
      return false;
  }
}

StatusOr<std::unique_ptr<SampleLedger>> SampleLedger::Open(const std::string& path, bool create) {
  const bool exists = PathExists(path);
  if (!exists && !create) return NotFound("sample ledger " + path + " does not exist");
  if (exists && IsDirectory(path)) return InvalidArgument(path + ": is a directory, not a ledger");
  sqlite3* db = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    Status s = SqlError(db, path, "cannot open the sample ledger");
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<SampleLedger> ledger(new SampleLedger(path, db));
  sqlite3_busy_timeout(db, 5000);
  sqlite3_extended_result_codes(db, 0);
  // A file that is not a database fails here (SQLITE_NOTADB), before anything is written.
  GYRE_RETURN_IF_ERROR(Exec(db, path, "PRAGMA journal_mode=WAL"));
  GYRE_RETURN_IF_ERROR(Exec(db, path, "PRAGMA synchronous=FULL"));
  GYRE_RETURN_IF_ERROR(Exec(db, path, "PRAGMA foreign_keys=OFF"));
  {
    Stmt tables(db, "SELECT count(*) FROM sqlite_master WHERE type='table'");
    if (tables.Step() != SQLITE_ROW) return SqlError(db, path, "cannot read the schema");
    const int64_t n = tables.Int(0);
    if (n > 0) {
      Stmt magic(db, "SELECT value FROM meta WHERE key='format'");
      if (!magic.ok() || magic.Step() != SQLITE_ROW || magic.Text(0) != kMagic) {
        return InvalidArgument(path + ": an SQLite database, but not a Gyre sample ledger");
      }
      Stmt version(db, "SELECT value FROM meta WHERE key='format_version'");
      if (!version.ok() || version.Step() != SQLITE_ROW) {
        return DataLoss(path + ": the sample ledger has no format_version");
      }
      const std::string v = version.Text(0);
      if (v != std::to_string(kFormatVersion)) {
        return InvalidArgument(path + ": sample ledger format version " + v +
                               ", but this gyre reads " + std::to_string(kFormatVersion) +
                               " (written by a newer gyre?)");
      }
      return ledger;
    }
  }
  Transaction tx(db, path);
  GYRE_RETURN_IF_ERROR(tx.begun());
  GYRE_RETURN_IF_ERROR(Exec(db, path, kSchema));
  Stmt meta(db, "INSERT INTO meta(key, value) VALUES (?, ?)");
  for (const auto& [k, v] : {std::pair<std::string, std::string>{"format", kMagic},
                             {"format_version", std::to_string(kFormatVersion)}}) {
    meta.Reset();
    if (meta.Bind(1, k).Bind(2, v).Step() != SQLITE_DONE) {
      return SqlError(db, path, "cannot write the ledger's format");
    }
  }
  GYRE_RETURN_IF_ERROR(tx.Commit());
  return ledger;
}

SampleLedger::~SampleLedger() { sqlite3_close(db_); }

Status SampleLedger::Add(const std::vector<NewSample>& samples, const MoveContext& context) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unordered_set<uint64_t> seen;
  for (const NewSample& s : samples) {
    if (!seen.insert(s.sample_id).second) {
      return InvalidArgument("sample " + std::to_string(s.sample_id) + " is added twice");
    }
    if (s.prompt.empty()) {
      return InvalidArgument("sample " + std::to_string(s.sample_id) + " has no prompt key");
    }
  }
  Transaction tx(db_, path_);
  GYRE_RETURN_IF_ERROR(tx.begun());
  Stmt exists(db_, "SELECT state FROM samples WHERE sample_id = ?");
  Stmt event(db_, kInsertEvent);
  Stmt sample(
      db_, "INSERT INTO samples(sample_id, group_id, prompt, state, seq) VALUES (?, ?, ?, 0, ?)");
  for (const NewSample& s : samples) {
    exists.Reset();
    const int rc = exists.Bind(1, ToDb(s.sample_id)).Step();
    if (rc == SQLITE_ROW) {
      return FailedPrecondition("sample " + std::to_string(s.sample_id) +
                                " is already in the ledger (" +
                                SampleStateName(static_cast<SampleState>(exists.Int(0))) + ")");
    }
    if (rc != SQLITE_DONE) return SqlError(db_, path_, "cannot look up a sample");
    GYRE_ASSIGN_OR_RETURN(const int64_t seq, RecordEvent(db_, path_, event, s.sample_id, -1,
                                                         SampleState::kQueued, context));
    sample.Reset();
    if (sample.Bind(1, ToDb(s.sample_id))
            .Bind(2, ToDb(s.group_id))
            .Bind(3, s.prompt)
            .Bind(4, seq)
            .Step() != SQLITE_DONE) {
      return SqlError(db_, path_, "cannot add a sample");
    }
  }
  return tx.Commit();
}

StatusOr<int64_t> SampleLedger::DropUnended(const MoveContext& context) {
  std::vector<uint64_t> ids;
  for (SampleState st : {SampleState::kQueued, SampleState::kGenerating, SampleState::kFinished,
                         SampleState::kScored}) {
    GYRE_ASSIGN_OR_RETURN(auto recs, InState(st));
    for (const auto& r : recs) ids.push_back(r.sample_id);
  }
  if (!ids.empty()) GYRE_RETURN_IF_ERROR(Move(ids, SampleState::kDropped, context));
  return static_cast<int64_t>(ids.size());
}

Status SampleLedger::Move(const std::vector<uint64_t>& ids, SampleState to,
                          const MoveContext& context) {
  std::lock_guard<std::mutex> lock(mu_);
  if ((to == SampleState::kFiltered || to == SampleState::kDropped) && context.reason.empty()) {
    return InvalidArgument(std::string("a move to ") + SampleStateName(to) + " needs a reason");
  }
  std::unordered_set<uint64_t> seen;
  for (uint64_t id : ids) {
    if (!seen.insert(id).second) {
      return InvalidArgument("sample " + std::to_string(id) + " is moved twice in one call");
    }
  }
  Transaction tx(db_, path_);
  GYRE_RETURN_IF_ERROR(tx.begun());
  Stmt current(db_, "SELECT state FROM samples WHERE sample_id = ?");
  Stmt event(db_, kInsertEvent);
  Stmt update(db_, "UPDATE samples SET state = ?, seq = ? WHERE sample_id = ?");
  for (uint64_t id : ids) {
    current.Reset();
    const int rc = current.Bind(1, ToDb(id)).Step();
    if (rc == SQLITE_DONE)
      return NotFound("sample " + std::to_string(id) + " is not in the ledger");
    if (rc != SQLITE_ROW) return SqlError(db_, path_, "cannot look up a sample");
    const int64_t from_raw = current.Int(0);
    if (!ValidState(from_raw)) {
      return DataLoss(path_ + ": sample " + std::to_string(id) + " has an unknown state");
    }
    const auto from = static_cast<SampleState>(from_raw);
    if (!IsAllowedMove(from, to)) {
      return FailedPrecondition("sample " + std::to_string(id) + " cannot move from " +
                                SampleStateName(from) + " to " + SampleStateName(to));
    }
    GYRE_ASSIGN_OR_RETURN(const int64_t seq,
                          RecordEvent(db_, path_, event, id, from_raw, to, context));
    update.Reset();
    if (update.Bind(1, static_cast<int64_t>(to)).Bind(2, seq).Bind(3, ToDb(id)).Step() !=
        SQLITE_DONE) {
      return SqlError(db_, path_, "cannot move a sample");
    }
  }
  return tx.Commit();
}

StatusOr<int64_t> SampleLedger::LastSequence() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_, "SELECT coalesce(max(seq), 0) FROM events");
  if (st.Step() != SQLITE_ROW) return SqlError(db_, path_, "cannot read the last event");
  return st.Int(0);
}

Status SampleLedger::RollbackTo(int64_t sequence) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sequence < 0) return InvalidArgument("ledger sequence " + std::to_string(sequence) + " < 0");
  Transaction tx(db_, path_);
  GYRE_RETURN_IF_ERROR(tx.begun());
  {
    Stmt last(db_, "SELECT coalesce(max(seq), 0) FROM events");
    if (last.Step() != SQLITE_ROW) return SqlError(db_, path_, "cannot read the last event");
    if (sequence > last.Int(0)) {
      return FailedPrecondition(path_ + ": the checkpoint names ledger event " +
                                std::to_string(sequence) + ", but the ledger ends at " +
                                std::to_string(last.Int(0)) + " (a ledger from another run?)");
    }
  }
  for (const char* sql : {
           // Samples with no event left did not exist yet.
           "DELETE FROM samples WHERE sample_id IN "
           "(SELECT sample_id FROM events GROUP BY sample_id HAVING min(seq) > ?1)",
           "DELETE FROM events WHERE seq > ?1",
           // The others take their last remaining event's state.
           "UPDATE samples SET (state, seq) = (SELECT e.to_state, e.seq FROM events e WHERE "
           "e.sample_id = samples.sample_id ORDER BY e.seq DESC LIMIT 1) WHERE seq > ?1",
       }) {
    Stmt st(db_, sql);
    if (st.Bind(1, sequence).Step() != SQLITE_DONE) {
      return SqlError(db_, path_, "cannot roll the ledger back");
    }
  }
  return tx.Commit();
}

StatusOr<SampleRecord> SampleLedger::Find(uint64_t sample_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql = std::string("SELECT ") + kRecordColumns +
                          " FROM samples s JOIN events e ON e.seq = s.seq WHERE s.sample_id = ?";
  Stmt st(db_, sql.c_str());
  const int rc = st.Bind(1, ToDb(sample_id)).Step();
  if (rc == SQLITE_DONE) {
    return NotFound("sample " + std::to_string(sample_id) + " is not in the ledger");
  }
  if (rc != SQLITE_ROW) return SqlError(db_, path_, "cannot look up a sample");
  return ReadRecord(st, path_);
}

StatusOr<std::vector<LedgerEvent>> SampleLedger::History(uint64_t sample_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_,
          "SELECT seq, sample_id, from_state, to_state, step, version, worker, reason FROM events "
          "WHERE sample_id = ? ORDER BY seq");
  st.Bind(1, ToDb(sample_id));
  std::vector<LedgerEvent> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    LedgerEvent e;
    e.sequence = st.Int(0);
    e.sample_id = FromDb(st.Int(1));
    e.has_from = !st.IsNull(2);
    const int64_t from = e.has_from ? st.Int(2) : 0;
    const int64_t to = st.Int(3);
    if (!ValidState(from) || !ValidState(to)) {
      return DataLoss(path_ + ": event " + std::to_string(e.sequence) + " has an unknown state");
    }
    e.from = static_cast<SampleState>(from);
    e.to = static_cast<SampleState>(to);
    e.context = ReadContext(st, 4);
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, path_, "cannot read a sample's history");
  return out;
}

namespace {

StatusOr<std::vector<SampleRecord>> ReadRecords(sqlite3* db, const std::string& path,
                                                const std::string& where, int64_t value) {
  const std::string sql = std::string("SELECT ") + kRecordColumns +
                          " FROM samples s JOIN events e ON e.seq = s.seq WHERE " + where +
                          " ORDER BY s.sample_id";
  Stmt st(db, sql.c_str());
  st.Bind(1, value);
  std::vector<SampleRecord> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    GYRE_ASSIGN_OR_RETURN(SampleRecord r, ReadRecord(st, path));
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return SqlError(db, path, "cannot list samples");
  return out;
}

}  // namespace

StatusOr<std::vector<SampleRecord>> SampleLedger::InState(SampleState state) {
  std::lock_guard<std::mutex> lock(mu_);
  return ReadRecords(db_, path_, "s.state = ?", static_cast<int64_t>(state));
}

StatusOr<std::vector<SampleRecord>> SampleLedger::Group(uint64_t group_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return ReadRecords(db_, path_, "s.group_id = ?", ToDb(group_id));
}

StatusOr<LedgerCounts> SampleLedger::Counts() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_, "SELECT state, count(*) FROM samples GROUP BY state");
  LedgerCounts c;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    const int64_t state = st.Int(0);
    if (!ValidState(state)) return DataLoss(path_ + ": a sample has an unknown state");
    c.by_state[state] = st.Int(1);
    c.total += st.Int(1);
  }
  if (rc != SQLITE_DONE) return SqlError(db_, path_, "cannot count samples");
  return c;
}

StatusOr<std::vector<PromptUse>> SampleLedger::PromptUsage() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt st(db_,
          "SELECT prompt, count(*), sum(state = 4), sum(state = 5), sum(state = 6) FROM samples "
          "GROUP BY prompt ORDER BY sum(state = 4) DESC, prompt");
  std::vector<PromptUse> out;
  int rc;
  while ((rc = st.Step()) == SQLITE_ROW) {
    PromptUse u;
    u.prompt = st.Text(0);
    u.samples = st.Int(1);
    u.trained = st.Int(2);
    u.filtered = st.Int(3);
    u.dropped = st.Int(4);
    out.push_back(std::move(u));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, path_, "cannot read prompt usage");
  return out;
}

}  // namespace gyre::controller
