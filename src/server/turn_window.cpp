#include "server/turn_window.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>

namespace mnemo {

std::string MessageHash::Hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi), static_cast<unsigned long long>(lo));
  return buf;
}

MessageHash ExtendHash(MessageHash h, const ChatMessage& m) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  const uint64_t prev[2] = {h.lo, h.hi};
  XXH3_128bits_update(st, prev, sizeof prev);
  XXH3_128bits_update(st, m.role.data(), m.role.size());
  XXH3_128bits_update(st, "", 1);  // the role ends here: ("ab", "c") and ("a", "bc") differ
  XXH3_128bits_update(st, m.content.data(), m.content.size());
  // Tool calls and results render too: each field ends with a 0 byte (as the role does).
  for (const ChatToolCall& c : m.tool_calls) {
    for (const std::string* f : {&c.id, &c.name, &c.arguments}) {
      XXH3_128bits_update(st, "", 1);
      XXH3_128bits_update(st, f->data(), f->size());
    }
  }
  if (!m.tool_call_id.empty() || !m.name.empty()) {
    XXH3_128bits_update(st, "\x01", 1);
    XXH3_128bits_update(st, m.tool_call_id.data(), m.tool_call_id.size());
    XXH3_128bits_update(st, "", 1);
    XXH3_128bits_update(st, m.name.data(), m.name.size());
  }
  const XXH128_hash_t d = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return MessageHash{d.low64, d.high64};
}

MessageHash HashMessages(std::span<const ChatMessage> m, MessageHash h) {
  for (const ChatMessage& x : m) h = ExtendHash(h, x);
  return h;
}

size_t HeadSize(std::span<const ChatMessage> m, size_t limit) {
  size_t lead = 0;
  while (lead < m.size() && m[lead].role == "system") ++lead;
  return std::min({lead + 1, limit, m.size()});
}

TurnWindow WindowOfPrompt(std::span<const ChatMessage> prompt) {
  TurnWindow w;
  w.prompt_hash = HashMessages(prompt);
  w.n = prompt.size();
  const size_t h = HeadSize(prompt, w.n);
  w.head.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(h));
  const size_t from = std::max(h, w.n >= 2 ? w.n - 2 : 0);
  w.recent.assign(prompt.begin() + static_cast<std::ptrdiff_t>(from), prompt.end());
  return w;
}

TurnWindow ExtendWindow(const TurnWindow& w, const ChatMessage& reply, std::span<const ChatMessage> more) {
  // C: the known tail of the next prompt, M[s0, n'); when the head was the whole prompt, C is all of it.
  std::vector<ChatMessage> c = w.recent;
  c.push_back(reply);
  c.insert(c.end(), more.begin(), more.end());
  TurnWindow out;
  out.prompt_hash = HashMessages(more, ExtendHash(w.prompt_hash, reply));
  out.n = w.n + 1 + more.size();
  if (w.head.size() < w.n) {
    out.head = w.head;  // the first non-system message is in it: later messages do not change it
  } else {
    std::vector<ChatMessage> all = w.head;  // the head was the whole prompt (w.recent is empty)
    all.insert(all.end(), c.begin(), c.end());
    c = all;
    out.head.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(HeadSize(all, out.n)));
  }
  const size_t from = std::max(out.head.size(), out.n >= 2 ? out.n - 2 : 0);  // absolute index
  const size_t s0 = out.n - c.size();
  out.recent.assign(c.begin() + static_cast<std::ptrdiff_t>(from - s0), c.end());
  return out;
}

std::vector<ChatMessage> WindowMessages(const TurnWindow& w, const ChatMessage& reply, std::span<const ChatMessage> more,
                                        size_t* n_old) {
  std::vector<ChatMessage> out = w.head;
  const size_t s0 = w.n - w.recent.size();      // absolute index of recent[0] (>= head size)
  const size_t skip = (s0 - w.head.size()) % 2;  // the dropped block M[h, d) has even length
  out.insert(out.end(), w.recent.begin() + static_cast<std::ptrdiff_t>(skip), w.recent.end());
  *n_old = out.size();
  out.push_back(reply);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

bool TemplateRendersWindows(const ChatTemplate& t) {
  if (t.source().find("strftime_now") != std::string::npos) return false;
  for (bool system : {false, true}) {
    for (int turns = 1; turns <= 6; ++turns) {
      for (int n_new = 1; n_new <= 2; ++n_new) {
        std::vector<ChatMessage> m;
        if (system) m.push_back({"system", "You are brief."});
        for (int i = 0; i < turns; ++i) {
          m.push_back({"user", "Question " + std::to_string(i) + "?"});
          m.push_back({"assistant", " Answer " + std::to_string(i) + ". "});
        }
        const size_t r = m.size() - 1;
        std::vector<ChatMessage> more;
        if (n_new == 2) more.push_back({"system", "Be exact."});
        more.push_back({"user", "And then?"});
        std::vector<ChatMessage> whole = m;
        whole.insert(whole.end(), more.begin(), more.end());
        const auto full = t.RenderAppend(whole, r, /*add_generation_prompt=*/true);
        size_t n_old = 0;
        const std::vector<ChatMessage> win =
            WindowMessages(WindowOfPrompt(std::span<const ChatMessage>(m).first(r)), m[r], more, &n_old);
        const auto part = t.RenderAppend(win, n_old, /*add_generation_prompt=*/true);
        if (full.ok() != part.ok()) return false;
        if (full.ok() && (full->reply_prefix != part->reply_prefix || full->reply != part->reply || full->tail != part->tail)) {
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace mnemo
