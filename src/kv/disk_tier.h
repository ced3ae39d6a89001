// T2: KV blocks in one file of fixed-size slots on local disk. Each slot carries a header naming
// the chunk it holds (session, chunk index, a hash of the tokens its KV depends on) and a checksum
// of its payload, so that a slot is only ever used for the chunk it was written for, and a corrupt
// or torn slot is detected and recomputed instead of used. The file survives restarts: Scan() lists
// what is there.
//
// Thread-safety: Write/Read may run on the transfer thread while Scan runs nowhere else; distinct
// slots may be accessed concurrently (pread/pwrite).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace mnemo {

struct DiskSlotId {
  int64_t session = -1;      // owner session id (engine numbering, stable across restarts)
  int32_t chunk = -1;        // chunk index in the session
  int32_t valid_end = 0;     // positions [chunk * 32, valid_end) of the chunk hold KV
  uint64_t token_hash = 0;   // hash of the session's tokens [0, valid_end): what the KV depends on
};

class DiskTier {
 public:
  // Opens or creates dir/kv-t2.bin with n_slots slots of payload_bytes each. `identity` stands for
  // what the KV depends on besides the tokens (the model's weights, the KV dtype, the precision):
  // an existing file made with another geometry or identity is discarded (its contents cannot be
  // used: a restart on another model of the same shape would otherwise serve the old model's KV).
  // *discarded says whether that happened.
  static Result<std::unique_ptr<DiskTier>> Open(const std::string& dir, int32_t n_slots, size_t payload_bytes,
                                                uint64_t identity = 0, bool* discarded = nullptr);
  ~DiskTier();

  int32_t n_slots() const { return n_slots_; }
  size_t payload_bytes() const { return payload_bytes_; }

  // Writes payload (payload_bytes) into slot with header `id`. durable = fdatasync after writing.
  Status Write(int32_t slot, const DiskSlotId& id, const void* payload, bool durable = false);
  // Reads a slot into payload; an Error when the slot is empty, names another chunk than `expect`
  // (if expect.session >= 0), or fails its checksum.
  Status Read(int32_t slot, const DiskSlotId& expect, void* payload) const;
  // Marks a slot empty (its header is overwritten).
  Status Clear(int32_t slot);

  struct Entry {
    int32_t slot;
    DiskSlotId id;
  };
  // Slots whose header is valid (the payload is checked only when read).
  std::vector<Entry> Scan() const;

 private:
  DiskTier() = default;
  int fd_ = -1;
  int32_t n_slots_ = 0;
  size_t payload_bytes_ = 0;
  size_t slot_bytes_ = 0;  // header + payload, rounded to 4 KiB
};

}  // namespace mnemo
