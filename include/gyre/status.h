#pragma once
// Status and StatusOr<T>: how every fallible Gyre function reports failure.
//
// A Status is either OK or carries a code and a human-readable message that says what went
// wrong and, where possible, what to do about it. Status values are cheap to copy and safe to
// use from any thread.

#include <cassert>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

namespace gyre {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input: config, data, request
  kNotFound,         // a file, tensor or worker that does not exist
  kAlreadyExists,
  kFailedPrecondition,
  kOutOfRange,
  kUnavailable,       // a peer that cannot be reached (yet)
  kDeadlineExceeded,  // a call or transfer that ran past its deadline
  kAborted,           // work cancelled: shutdown, signal, dead worker
  kDataLoss,          // checksum mismatch, truncated file
  kInternal,          // a bug in Gyre
  kUnimplemented,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is "context: message". OK stays OK.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }

namespace internal {
// Prints "StatusOr::value() called on an error: <status>" to stderr and aborts.
[[noreturn]] void DieOnValueOfError(const Status& status);
}  // namespace internal

// Either a value of type T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit by design
    assert(!status_.ok() && "StatusOr constructed from an OK status without a value");
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr built from OK Status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // Accessing the value of an error is a bug in the caller: it aborts with the status message
  // (in every build type), never undefined behaviour.
  T& value() & { return CheckedValue(); }
  const T& value() const& { return CheckedValue(); }
  T&& value() && { return std::move(CheckedValue()); }
  T& operator*() & { return CheckedValue(); }
  const T& operator*() const& { return CheckedValue(); }
  T* operator->() { return &CheckedValue(); }
  const T* operator->() const { return &CheckedValue(); }

 private:
  T& CheckedValue() {
    if (!value_.has_value()) internal::DieOnValueOfError(status_);
    return *value_;
  }
  const T& CheckedValue() const {
    if (!value_.has_value()) internal::DieOnValueOfError(status_);
    return *value_;
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace gyre

#define GYRE_STATUS_CONCAT_INNER_(a, b) a##b
#define GYRE_STATUS_CONCAT_(a, b) GYRE_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define GYRE_RETURN_IF_ERROR(expr)                       \
  do {                                                   \
    ::gyre::Status gyre_status_tmp_ = (expr);            \
    if (!gyre_status_tmp_.ok()) return gyre_status_tmp_; \
  } while (0)

// `GYRE_ASSIGN_OR_RETURN(auto x, Foo());` assigns the value of a StatusOr or returns its error.
#define GYRE_ASSIGN_OR_RETURN(lhs, expr) \
  GYRE_ASSIGN_OR_RETURN_IMPL_(GYRE_STATUS_CONCAT_(gyre_statusor_, __LINE__), lhs, expr)
#define GYRE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
