#include "kv/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace mnemo {
namespace {

constexpr uint64_t kSlotMagic = 0x314b564f4d454e4dull;  // "MNEMOVK1"
constexpr uint64_t kFileMagic = 0x3254564f4d454e4dull;  // "MNEMOVT2"
constexpr size_t kPage = 4096;

struct FileHeader {  // at offset 0, one page
  uint64_t magic;
  uint64_t n_slots;
  uint64_t payload_bytes;
  uint64_t identity;  // see DiskTier::Open
};

struct SlotHeader {  // at the start of each slot
  uint64_t magic;          // kSlotMagic when the slot holds data
  int64_t session;
  int32_t chunk;
  int32_t valid_end;
  uint64_t token_hash;
  uint64_t payload_bytes;
  uint64_t payload_hash;   // XXH3-64 of the payload
  uint64_t header_hash;    // XXH3-64 of the fields above
};

uint64_t HeaderHash(const SlotHeader& h) { return XXH3_64bits(&h, offsetof(SlotHeader, header_hash)); }

bool WriteAll(int fd, const void* p, size_t n, off_t off) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = pwrite(fd, c, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= w;
    off += w;
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n, off_t off) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = pread(fd, c, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= r;
    off += r;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const std::string& dir, int32_t n_slots, size_t payload_bytes,
                                                 uint64_t identity, bool* discarded) {
  if (n_slots <= 0) return MakeError("disk tier: need at least one slot");
  mkdir(dir.c_str(), 0755);
  std::string path = dir + "/kv-t2.bin";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return MakeError("disk tier: cannot open %s: %s", path.c_str(), std::strerror(errno));
  std::unique_ptr<DiskTier> t(new DiskTier());
  t->fd_ = fd;
  t->n_slots_ = n_slots;
  t->payload_bytes_ = payload_bytes;
  t->slot_bytes_ = (sizeof(SlotHeader) + payload_bytes + kPage - 1) / kPage * kPage;
  FileHeader fh{};
  const bool read = ReadAll(fd, &fh, sizeof fh, 0);
  bool same = read && fh.magic == kFileMagic && fh.n_slots == uint64_t(n_slots) && fh.payload_bytes == payload_bytes &&
              fh.identity == identity;
  if (discarded) *discarded = read && !same;
  if (!same) {  // new file, or another geometry or model: start empty
    if (ftruncate(fd, 0) != 0) return MakeError("disk tier: cannot truncate %s", path.c_str());
    fh = FileHeader{kFileMagic, uint64_t(n_slots), payload_bytes, identity};
    if (!WriteAll(fd, &fh, sizeof fh, 0)) return MakeError("disk tier: cannot write %s", path.c_str());
  }
  if (ftruncate(fd, off_t(kPage + t->slot_bytes_ * n_slots)) != 0) {
    return MakeError("disk tier: cannot size %s: %s", path.c_str(), std::strerror(errno));
  }
  return t;
}

DiskTier::~DiskTier() {
  if (fd_ >= 0) close(fd_);
}

Status DiskTier::Write(int32_t slot, const DiskSlotId& id, const void* payload, bool durable) {
  if (slot < 0 || slot >= n_slots_) return MakeError("disk tier: slot %d out of range", slot);
  std::unique_ptr<char[]> buf(new char[sizeof(SlotHeader) + payload_bytes_]);
  SlotHeader h{kSlotMagic, id.session, id.chunk, id.valid_end, id.token_hash, payload_bytes_,
               XXH3_64bits(payload, payload_bytes_), 0};
  h.header_hash = HeaderHash(h);
  std::memcpy(buf.get(), &h, sizeof h);
  std::memcpy(buf.get() + sizeof h, payload, payload_bytes_);
  if (!WriteAll(fd_, buf.get(), sizeof h + payload_bytes_, off_t(kPage + slot_bytes_ * slot))) {
    return MakeError("disk tier: write of slot %d failed: %s", slot, std::strerror(errno));
  }
  if (durable && fdatasync(fd_) != 0) return MakeError("disk tier: fdatasync failed");
  return Status::Ok();
}

Status DiskTier::Read(int32_t slot, const DiskSlotId& expect, void* payload) const {
  if (slot < 0 || slot >= n_slots_) return MakeError("disk tier: slot %d out of range", slot);
  SlotHeader h;
  off_t off = off_t(kPage + slot_bytes_ * slot);
  if (!ReadAll(fd_, &h, sizeof h, off)) return MakeError("disk tier: slot %d unreadable", slot);
  if (h.magic != kSlotMagic || h.header_hash != HeaderHash(h) || h.payload_bytes != payload_bytes_) {
    return MakeError("disk tier: slot %d has no valid header", slot);
  }
  if (expect.session >= 0 &&
      (h.session != expect.session || h.chunk != expect.chunk || h.valid_end != expect.valid_end ||
       h.token_hash != expect.token_hash)) {
    return MakeError("disk tier: slot %d holds another chunk", slot);
  }
  if (!ReadAll(fd_, payload, payload_bytes_, off + off_t(sizeof h))) {
    return MakeError("disk tier: slot %d payload unreadable", slot);
  }
  if (XXH3_64bits(payload, payload_bytes_) != h.payload_hash) {
    return MakeError("disk tier: slot %d failed its checksum", slot);
  }
  return Status::Ok();
}

Status DiskTier::Clear(int32_t slot) {
  SlotHeader h{};
  if (!WriteAll(fd_, &h, sizeof h, off_t(kPage + slot_bytes_ * slot))) {
    return MakeError("disk tier: clearing slot %d failed", slot);
  }
  return Status::Ok();
}

std::vector<DiskTier::Entry> DiskTier::Scan() const {
  std::vector<Entry> out;
  for (int32_t s = 0; s < n_slots_; s++) {
    SlotHeader h;
    if (!ReadAll(fd_, &h, sizeof h, off_t(kPage + slot_bytes_ * s))) continue;
    if (h.magic != kSlotMagic || h.header_hash != HeaderHash(h) || h.payload_bytes != payload_bytes_) continue;
    out.push_back({s, DiskSlotId{h.session, h.chunk, h.valid_end, h.token_hash}});
  }
  return out;
}

}  // namespace mnemo
