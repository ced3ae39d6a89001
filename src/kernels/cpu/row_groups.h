// Internal to src/kernels/cpu: splitting activation rows into register-sized groups.
#pragma once

namespace mnemo::kernels::detail {

// Splits n rows into groups of at most kMax (1..12), as even as possible, calling
// fn.template operator()<R>(first_row) per group: the kernels keep R rows' accumulators in
// registers, so R is a template parameter.
template <int kMax, class Fn>
void ForRowGroups(int n, Fn&& fn) {
  static_assert(kMax >= 1 && kMax <= 12);
  const int groups = (n + kMax - 1) / kMax;
  int j = 0;
  for (int g = 0; g < groups; g++) {
    const int r = (n - j) / (groups - g) + ((n - j) % (groups - g) != 0);
    switch (r) {
      case 1: fn.template operator()<1>(j); break;
      case 2: if constexpr (kMax >= 2) fn.template operator()<2>(j); break;
      case 3: if constexpr (kMax >= 3) fn.template operator()<3>(j); break;
      case 4: if constexpr (kMax >= 4) fn.template operator()<4>(j); break;
      case 5: if constexpr (kMax >= 5) fn.template operator()<5>(j); break;
      case 6: if constexpr (kMax >= 6) fn.template operator()<6>(j); break;
      case 7: if constexpr (kMax >= 7) fn.template operator()<7>(j); break;
      case 8: if constexpr (kMax >= 8) fn.template operator()<8>(j); break;
      case 9: if constexpr (kMax >= 9) fn.template operator()<9>(j); break;
      case 10: if constexpr (kMax >= 10) fn.template operator()<10>(j); break;
      case 11: if constexpr (kMax >= 11) fn.template operator()<11>(j); break;
      case 12: if constexpr (kMax >= 12) fn.template operator()<12>(j); break;
    }
    j += r;
  }
}

}  // namespace mnemo::kernels::detail
