// Request-id de-duplication (X-Mnemo-Request-Id, issue 14; docs/api.md): a turn's request that
// carries an id runs at most once per owner and id, and a retry is answered with what the first
// attempt answered.
//
// How: the first attempt's answer (status and body) is recorded in the store by the same
// transaction that commits its turn (TurnCommit::request), so a turn and its record exist together
// or not at all. Before a request runs, Begin looks for:
//   - an attempt of the same id still running on this replica: 409 request_in_progress (with
//     Retry-After), or 422 request_id_reused when its body differs;
//   - a record in the store (any replica's): the stored answer (a replay), or 422 when the body
//     differs (a hash of the route and body is recorded).
// Attempts racing on different replicas both run, and the store's key lets one commit: the other's
// commit fails with nothing applied, and Committed() finds the winner's record to answer with.
// Records expire after ttl_s; a background thread deletes expired ones.
//
// Threads: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "server/api_error.h"
#include "store/store.h"

namespace mnemo {

// X-Mnemo-Request-Id's rule: 1 to 128 printable ASCII characters (0x20..0x7e).
constexpr size_t kMaxDedupRequestId = 128;
bool ValidDedupRequestId(std::string_view id);

class RequestDedup {
 public:
  // ttl_s > 0: how long records answer retries. store may be null (then no header is honoured
  // beyond the checks: nothing can be recorded).
  RequestDedup(Store* store, double ttl_s);
  ~RequestDedup();
  RequestDedup(const RequestDedup&) = delete;
  RequestDedup& operator=(const RequestDedup&) = delete;

  struct Inflight;
  // One running attempt of an id, from Begin until Release or its last copy is dropped (after its
  // commit): meanwhile other attempts of the id on this replica get 409.
  class Ticket {
   public:
    Ticket(std::shared_ptr<Inflight> inflight, std::string key, StoredRequest base)
        : inflight_(std::move(inflight)), key_(std::move(key)), base_(std::move(base)) {}
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // The record to commit with the turn: this request's answer.
    StoredRequest Record(int status, std::string body) const;
    // Ends the claim on the id before the ticket dies: call it once the request's last commit
    // returned (its record, if any, is then in the store), before the answer goes out, so that a
    // retry sent right after the answer finds the record, not a 409. Idempotent.
    void Release();
    const StoredRequest& base() const { return base_; }

   private:
    std::shared_ptr<Inflight> inflight_;
    std::string key_;     // owner + '\n' + request id
    StoredRequest base_;  // owner, request id, body hash, expiry
    bool released_ = false;  // guarded by inflight_->mu
  };

  struct Outcome {
    std::shared_ptr<Ticket> ticket;       // run the request; commit its turn with ticket->Record(...)
    std::optional<StoredRequest> replay;  // answer with this (the request ran before)
    std::optional<ApiError> error;        // answer with this (400, 409, 422, or 503 from the store)
  };
  // header: the X-Mnemo-Request-Id value, nullopt when absent (then the Outcome is empty: run
  // without a record). route and body make the hash that tells a retry from a reuse.
  // Cost: one primary-key probe of the store.
  Outcome Begin(const std::optional<std::string>& header, const std::string& owner, std::string_view route,
                std::string_view body);
  // After the commit of t's turn failed: the record another attempt of the same request committed
  // first (same body), if there is one. Cost: one probe.
  std::optional<StoredRequest> Committed(const Ticket& t);

 private:
  void Clean();  // the background thread: ExpireRequests every period

  Store* store_;
  const double ttl_s_;
  std::shared_ptr<Inflight> inflight_;
  std::mutex mu_;                 // guards stop_
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread cleaner_;
};

}  // namespace mnemo
