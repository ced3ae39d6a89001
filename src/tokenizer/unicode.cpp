#include "tokenizer/unicode.h"

#include <algorithm>

namespace mnemo {

UnicodeClass GetUnicodeClass(uint32_t cp) {
  using unicode_data::kClassRanges;
  using unicode_data::kNumClassRanges;
  if (cp < 0x80) {
    // ASCII fast path (the tables agree; this only skips the search).
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return UnicodeClass::kLetter;
    if (cp >= '0' && cp <= '9') return UnicodeClass::kNumber;
    if (cp == ' ') return UnicodeClass::kSeparator;
    if (cp < 0x20 || cp == 0x7F) return UnicodeClass::kOther;
  }
  const ClassRange* end = kClassRanges + kNumClassRanges;
  // First run whose last >= cp.
  const ClassRange* it = std::lower_bound(kClassRanges, end, cp,
                                          [](const ClassRange& r, uint32_t c) { return r.last < c; });
  if (it == end || it->first > cp) return UnicodeClass::kOther;
  return it->klass;
}

bool IsWhiteSpace(uint32_t cp) {
  using unicode_data::kNumWhiteSpaceRanges;
  using unicode_data::kWhiteSpaceRanges;
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  for (int i = 0; i < kNumWhiteSpaceRanges; ++i) {
    if (cp < kWhiteSpaceRanges[i].first) return false;
    if (cp <= kWhiteSpaceRanges[i].last) return true;
  }
  return false;
}

bool DecodeUtf8(std::string_view text, size_t* pos, uint32_t* cp) {
  const size_t p = *pos;
  const auto b = [&](size_t i) { return static_cast<uint8_t>(text[p + i]); };
  const auto cont = [&](size_t i) { return p + i < text.size() && (b(i) & 0xC0) == 0x80; };
  const uint8_t b0 = b(0);
  if (b0 < 0x80) {
    *cp = b0;
    *pos = p + 1;
    return true;
  }
  if ((b0 & 0xE0) == 0xC0) {
    if (!cont(1)) return false;
    *cp = (uint32_t(b0 & 0x1F) << 6) | (b(1) & 0x3F);
    *pos = p + 2;
    return true;
  }
  if ((b0 & 0xF0) == 0xE0) {
    if (!cont(1) || !cont(2)) return false;
    *cp = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    *pos = p + 3;
    return true;
  }
  if ((b0 & 0xF8) == 0xF0) {
    if (!cont(1) || !cont(2) || !cont(3)) return false;
    *cp = (uint32_t(b0 & 0x07) << 18) | (uint32_t(b(1) & 0x3F) << 12) | (uint32_t(b(2) & 0x3F) << 6) |
          (b(3) & 0x3F);
    *pos = p + 4;
    return true;
  }
  return false;  // a continuation byte or F8..FF
}

std::vector<uint32_t> DecodeUtf8Lenient(std::string_view text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp;
    if (DecodeUtf8(text, &pos, &cp)) {
      cps.push_back(cp);
    } else {
      cps.push_back(kReplacementChar);
      ++pos;
    }
  }
  return cps;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int Utf8Check(std::string_view bytes) {
  const uint8_t b0 = static_cast<uint8_t>(bytes[0]);
  int n;                   // sequence length the lead byte announces
  uint8_t lo = 0x80;       // allowed range of the second byte (narrower after E0, ED, F0, F4)
  uint8_t hi = 0xBF;
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return -1;  // continuation byte, C0/C1 (always overlong) or F5..FF
  }
  for (int k = 1; k < n; ++k) {
    if (static_cast<size_t>(k) >= bytes.size()) return 0;
    const uint8_t b = static_cast<uint8_t>(bytes[k]);
    const uint8_t l = k == 1 ? lo : 0x80;
    const uint8_t h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return -k;
  }
  return n;
}

}  // namespace mnemo
