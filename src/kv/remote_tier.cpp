#include "kv/remote_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "base/log.h"

namespace mnemo {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr size_t kRecentKeys = size_t(1) << 16;  // puts remembered (to skip repeating them)
constexpr size_t kPutBatchBytes = size_t(8) << 20;  // one pipeline of SETs carries at most this
constexpr double kEwma = 0.2;                        // weight of a new throughput sample

uint64_t RecentKey(const RemoteChunkId& id) { return id.hash_lo ^ (id.hash_hi * 31) ^ static_cast<uint64_t>(id.end); }

}  // namespace

Result<std::unique_ptr<RemoteTier>> RemoteTier::Create(const RemoteTierConfig& config, const RemoteKvSpace& space) {
  auto url = ParseRedisUrl(config.url);
  if (!url.ok()) return url.error();
  if (space.block_bytes == 0) return MakeError(StatusCode::kInvalidArgument, "remote KV tier: empty blocks");
  return std::unique_ptr<RemoteTier>(new RemoteTier(config, space, std::move(url.value())));
}

RemoteTier::RemoteTier(const RemoteTierConfig& config, const RemoteKvSpace& space, RedisUrl url)
    : config_(config), space_(space), url_(std::move(url)) {
  stats_.rtt_s = 5e-4;        // priors until measured: a LAN round trip,
  stats_.bytes_per_s = 1e9;   // and about a 10 Gb/s link
  thread_ = std::thread([this] { Run(); });
}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RemoteTier::Fetch(std::vector<RemoteFill> fills) {
  if (fills.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& f : fills) fills_.push_back(f);
  }
  cv_.notify_all();
}

std::vector<std::pair<uint64_t, bool>> RemoteTier::TakeCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, bool>> out;
  out.swap(completed_);
  return out;
}

RemoteOffer RemoteTier::Offer(const RemoteChunkId& id, KvStorage& src, int32_t block, double wait_s) {
  const uint64_t rk = RecentKey(id);
  const size_t bytes = RemoteHeaderBytes() + space_.block_bytes;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (recent_.count(rk)) return RemoteOffer::kKnown;
    if (!available_.load()) {
      stats_.puts_dropped++;
      return RemoteOffer::kDropped;
    }
    if (queued_bytes_ + bytes > config_.max_queued_bytes) {
      if (wait_s > 0) {
        idle_cv_.wait_for(lock, std::chrono::duration<double>(wait_s),
                          [&] { return stop_ || queued_bytes_ + bytes <= config_.max_queued_bytes; });
      }
      if (queued_bytes_ + bytes > config_.max_queued_bytes) {
        stats_.puts_dropped++;
        return RemoteOffer::kDropped;
      }
    }
    queued_bytes_ += bytes;  // claimed before copying, so concurrent offers stay within the bound
    recent_.insert(rk);
    recent_order_.push_back(rk);
    if (recent_order_.size() > kRecentKeys) {
      recent_.erase(recent_order_.front());
      recent_order_.pop_front();
    }
  }
  Put p{id, std::string(bytes, '\0')};
  const size_t lb = src.shape().LayerBlockBytes();
  char* out = p.value.data() + RemoteHeaderBytes();
  for (int l = 0; l < src.shape().n_layers; l++) std::memcpy(out + lb * l, src.block(l, block), lb);
  {
    std::lock_guard<std::mutex> lock(mu_);
    puts_.push_back(std::move(p));
  }
  cv_.notify_all();
  return RemoteOffer::kQueued;
}

void RemoteTier::Drain(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return puts_.empty() && busy_puts_ == 0; });
}

RemoteStats RemoteTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RemoteStats s = stats_;
  s.available = available_.load();
  return s;
}

RedisConnection* RemoteTier::Connection() {
  if (conn_) return conn_.get();
  const double now = Now();
  if (now < retry_at_) return nullptr;
  auto c = RedisConnection::Connect(url_, config_.connect_timeout_s, config_.command_timeout_s);
  const double t0 = Now();
  Status ping = c.ok() ? (*c)->Ping() : Status(c.error());
  if (!ping.ok()) {
    MarkDown(ping.error());
    return nullptr;
  }
  conn_ = std::move(c.value());
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.rtt_s = Now() - t0;
  }
  if (logged_down_) spdlog::info("remote KV tier {}:{} answers again", url_.host, url_.port);
  logged_down_ = false;
  available_ = true;
  return conn_.get();
}

void RemoteTier::MarkDown(const Error& e) {
  conn_.reset();
  retry_at_ = Now() + config_.retry_s;
  available_ = false;
  if (!logged_down_) {
    spdlog::warn("remote KV tier {}:{} unavailable ({}): chunks are recomputed and puts dropped; retrying every {} s",
                 url_.host, url_.port, e.message, config_.retry_s);
    logged_down_ = true;
  }
  // Puts queued now would only wait for the connection: drop them.
  std::lock_guard<std::mutex> lock(mu_);
  stats_.puts_dropped += static_cast<int64_t>(puts_.size());
  for (const Put& p : puts_) ForgetLocked(p);
  puts_.clear();
  queued_bytes_ = 0;
  idle_cv_.notify_all();
}

void RemoteTier::Run() {
  for (;;) {
    std::vector<RemoteFill> fills;
    std::vector<Put> puts;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return stop_ || !fills_.empty() || !puts_.empty(); };
      if (available_.load()) {
        cv_.wait(lock, ready);
      } else if (!cv_.wait_for(lock, std::chrono::duration<double>(std::max(retry_at_ - Now(), 1e-3)), ready)) {
        // Down and idle: try to reconnect on our own, since the callers send nothing while down.
        lock.unlock();
        Connection();
        continue;
      }
      if (stop_) return;
      if (!fills_.empty()) {  // fetches first: a turn waits for them
        fills.assign(fills_.begin(), fills_.end());
        fills_.clear();
      } else {
        size_t bytes = 0;
        while (!puts_.empty() && (puts.empty() || bytes + puts_.front().value.size() <= kPutBatchBytes)) {
          bytes += puts_.front().value.size();
          puts.push_back(std::move(puts_.front()));
          puts_.pop_front();
        }
        busy_puts_++;
      }
    }
    if (!fills.empty()) {
      RunFills(fills);
      if (listener_) listener_();
    } else {
      RunPuts(puts);
      std::lock_guard<std::mutex> lock(mu_);
      busy_puts_--;
      idle_cv_.notify_all();
    }
  }
}

void RemoteTier::RunFills(std::vector<RemoteFill>& fills) {
  std::vector<bool> ok(fills.size(), false);
  int64_t hits = 0, rejected = 0, bytes = 0, failed = 0;
  RedisConnection* c = Connection();
  if (c) {
    std::vector<std::string> keys;
    for (const auto& f : fills) keys.push_back(RemoteKey(space_, f.id));
    const double t0 = Now();
    Status st = c->GetMany(keys, [&](size_t i, std::string_view value) {
      auto payload = OpenRemoteValue(space_, fills[i].id, value);
      if (!payload.ok()) {
        rejected++;
        spdlog::debug("remote KV tier: {} not used: {}", keys[i], payload.error().message);
        return;
      }
      KvStorage& dst = *fills[i].dst;
      const size_t lb = dst.shape().LayerBlockBytes();
      for (int l = 0; l < dst.shape().n_layers; l++) std::memcpy(dst.block(l, fills[i].block), payload->data() + lb * l, lb);
      ok[i] = true;
      hits++;
      bytes += static_cast<int64_t>(value.size());
    });
    const double t = Now() - t0;
    if (!st.ok()) {
      MarkDown(st.error());
      std::fill(ok.begin(), ok.end(), false);  // a block half-written by a broken pipeline is not used
      failed = static_cast<int64_t>(fills.size());
      hits = 0;
    } else if (bytes > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      const double sample = static_cast<double>(bytes) / std::max(t - stats_.rtt_s, 1e-5);
      stats_.bytes_per_s = (1 - kEwma) * stats_.bytes_per_s + kEwma * sample;
    }
  } else {
    failed = static_cast<int64_t>(fills.size());
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.gets += static_cast<int64_t>(fills.size());
  stats_.hits += hits;
  stats_.rejected += rejected;
  stats_.failed += failed;
  stats_.misses += static_cast<int64_t>(fills.size()) - hits - rejected - failed;
  stats_.bytes_read += bytes;
  for (size_t i = 0; i < fills.size(); i++) completed_.push_back({fills[i].op, ok[i]});
}

void RemoteTier::ForgetLocked(const Put& p) { recent_.erase(RecentKey(p.id)); }

void RemoteTier::RunPuts(std::vector<Put>& puts) {
  size_t bytes = 0;
  for (const auto& p : puts) bytes += p.value.size();
  RedisConnection* c = Connection();
  if (!c) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.puts_dropped += static_cast<int64_t>(puts.size());
    for (const Put& p : puts) ForgetLocked(p);
    queued_bytes_ -= std::min(queued_bytes_, bytes);
    return;
  }
  std::vector<std::pair<std::string, std::string>> kv;
  for (auto& p : puts) {
    SealRemoteValue(space_, p.id, &p.value);
    kv.emplace_back(RemoteKey(space_, p.id), std::move(p.value));
  }
  Status st = c->SetMany(kv, config_.ttl_s);
  const bool lost = !st.ok() && st.code() == StatusCode::kUnavailable;
  if (lost) MarkDown(st.error());
  if (!st.ok() && !lost) spdlog::debug("remote KV tier: {}", st.error().message);
  std::lock_guard<std::mutex> lock(mu_);
  queued_bytes_ -= std::min(queued_bytes_, bytes);
  if (lost) {
    stats_.puts_failed += static_cast<int64_t>(puts.size());
    for (const Put& p : puts) ForgetLocked(p);
  } else {
    stats_.puts += static_cast<int64_t>(puts.size());
    stats_.bytes_written += static_cast<int64_t>(bytes);
    if (!st.ok()) stats_.puts_failed++;  // at least one refused (e.g. OOM under noeviction)
  }
  idle_cv_.notify_all();
}

}  // namespace mnemo
