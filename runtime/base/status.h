// Status and Result<T>: the one error model of chunkserve's host code.
//
// A Status is a code plus a human-readable message. OK carries no message and costs one pointer
// compare to test. Functions that can fail return Status or Result<T>; both are [[nodiscard]], so
// an ignored error is a compile warning (an error in CI).
//
// Conventions:
//  - Input errors become a Status where the input enters (C API, wire decode, Engine::Submit,
//    config validation). CHECK is only for broken invariants that no input can reach.
//  - Expected conditions (no free KV slots, queue full) are Status values, never exceptions.
//  - Messages are lower case, say what was wrong and with which value: "token id 70000 >= vocab
//    size 32000". Callers may prefix context with Status::Annotate.
//
// The codes mirror the C ABI's status codes one to one; their numeric values are part of the ABI
// and never change (new codes are only appended).
#ifndef CHUNKSERVE_RUNTIME_BASE_STATUS_H_
#define CHUNKSERVE_RUNTIME_BASE_STATUS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace chunkserve {

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,     // the caller passed something malformed or out of range
  kNotFound = 2,            // a named thing (request, sequence, file) does not exist
  kAlreadyExists = 3,       // a thing with that id exists already
  kResourceExhausted = 4,   // no free KV slots, queue full, budget spent; retry may succeed
  kFailedPrecondition = 5,  // the system is not in a state where the call makes sense
  kOutOfRange = 6,          // a position past a valid range (file offset, sequence length)
  kUnavailable = 7,         // a peer or device cannot be reached now; retryable
  kDeadlineExceeded = 8,    // a deadline passed before the work completed
  kCancelled = 9,           // the caller cancelled the operation
  kInternal = 10,           // an invariant broke inside chunkserve: a bug
  kUnimplemented = 11,      // not supported in this build or configuration
  kDataLoss = 12,           // stored bytes are truncated or corrupt (safetensors, wire frames)
  kAborted = 13,            // a collective or transaction was aborted (rank failure)
  kUnauthenticated = 14,    // the peer did not prove the cluster secret or client token
};

// Returns the stable name of a code, e.g. "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  // OK.
  Status() = default;
  Status(StatusCode code, std::string_view message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string_view m) { return {StatusCode::kInvalidArgument, m}; }
  static Status NotFound(std::string_view m) { return {StatusCode::kNotFound, m}; }
  static Status AlreadyExists(std::string_view m) { return {StatusCode::kAlreadyExists, m}; }
  static Status ResourceExhausted(std::string_view m) {
    return {StatusCode::kResourceExhausted, m};
  }
  static Status FailedPrecondition(std::string_view m) {
    return {StatusCode::kFailedPrecondition, m};
  }
  static Status OutOfRange(std::string_view m) { return {StatusCode::kOutOfRange, m}; }
  static Status Unavailable(std::string_view m) { return {StatusCode::kUnavailable, m}; }
  static Status DeadlineExceeded(std::string_view m) { return {StatusCode::kDeadlineExceeded, m}; }
  static Status Cancelled(std::string_view m) { return {StatusCode::kCancelled, m}; }
  static Status Internal(std::string_view m) { return {StatusCode::kInternal, m}; }
  static Status Unimplemented(std::string_view m) { return {StatusCode::kUnimplemented, m}; }
  static Status DataLoss(std::string_view m) { return {StatusCode::kDataLoss, m}; }
  static Status Aborted(std::string_view m) { return {StatusCode::kAborted, m}; }
  static Status Unauthenticated(std::string_view m) { return {StatusCode::kUnauthenticated, m}; }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // Empty for OK.
  std::string_view message() const { return rep_ ? std::string_view(rep_->message) : ""; }

  // Returns a copy whose message is "<context>: <message>". OK stays OK.
  Status Annotate(std::string_view context) const;

  // "OK" or "INVALID_ARGUMENT: <message>".
  std::string ToString() const;

  // Explicitly discards the status where ignoring it is the right call; say why at the call site.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;  // null means OK
};

std::ostream& operator<<(std::ostream& os, const Status& status);
std::ostream& operator<<(std::ostream& os, StatusCode code);

// Result<T> holds either a T or a non-OK Status.
//
// Constructing a Result from an OK Status is a bug (there would be no value); it is turned into
// an INTERNAL error rather than an abort, so callers still see a failure they can report.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(const T& value) : v_(value) {}                 // NOLINT(runtime/explicit)
  Result(T&& value) : v_(std::move(value)) {}           // NOLINT(runtime/explicit)
  Result(const Status& status) : v_(FromStatus(status)) {}  // NOLINT(runtime/explicit)
  Result(Status&& status) : v_(FromStatus(std::move(status))) {}  // NOLINT(runtime/explicit)
  template <typename U>
    requires std::is_constructible_v<T, U&&> && (!std::is_same_v<std::decay_t<U>, T>) &&
             (!std::is_same_v<std::decay_t<U>, Status>)
  Result(U&& value) : v_(std::in_place_index<1>, std::forward<U>(value)) {}  // NOLINT

  bool ok() const { return v_.index() == 1; }
  // OK when a value is present.
  Status status() const { return ok() ? Status() : std::get<0>(v_); }

  // Precondition: ok(). Callers check ok() (or use CHUNKSERVE_ASSIGN_OR_RETURN) first.
  T& value() & { return std::get<1>(v_); }
  const T& value() const& { return std::get<1>(v_); }
  T&& value() && { return std::get<1>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // The value, or `fallback` when this holds an error.
  T value_or(T fallback) const& { return ok() ? value() : std::move(fallback); }

 private:
  static Status FromStatus(Status s) {
    if (s.ok()) return Status::Internal("Result constructed from an OK status without a value");
    return s;
  }
  std::variant<Status, T> v_;
};

namespace internal {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace chunkserve

#define CHUNKSERVE_CONCAT_INNER_(a, b) a##b
#define CHUNKSERVE_CONCAT_(a, b) CHUNKSERVE_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (a Status or Result) is not OK.
#define CHUNKSERVE_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                                   \
    auto&& chunkserve_status_or_ = (expr);                                               \
    if (!chunkserve_status_or_.ok()) {                                                   \
      return ::chunkserve::internal::AsStatus(chunkserve_status_or_);                    \
    }                                                                                    \
  } while (false)

// `lhs` is a declaration or an assignable expression; `rexpr` yields a Result<T>.
//   CHUNKSERVE_ASSIGN_OR_RETURN(Config config, Config::Parse(text));
#define CHUNKSERVE_ASSIGN_OR_RETURN(lhs, rexpr) \
  CHUNKSERVE_ASSIGN_OR_RETURN_IMPL_(CHUNKSERVE_CONCAT_(chunkserve_result_, __LINE__), lhs, rexpr)
#define CHUNKSERVE_ASSIGN_OR_RETURN_IMPL_(result, lhs, rexpr) \
  auto result = (rexpr);                                      \
  if (!result.ok()) return result.status();                   \
  lhs = std::move(result).value()

#endif  // CHUNKSERVE_RUNTIME_BASE_STATUS_H_
