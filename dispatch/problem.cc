#include "dispatch/problem.h"

#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/strings.h"

namespace cubist {

absl::StatusOr<DeviceSm> ParseDeviceSm(std::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("device SM '", Sv(text),
                     "': expected a compute capability such as 90, 90a, sm_90 or 9.0"));
  };
  std::string_view s = text;
  if (s.substr(0, 3) == "sm_") s.remove_prefix(3);
  if (!s.empty() && (s.back() == 'a' || s.back() == 'f')) s.remove_suffix(1);
  if (s.empty()) return bad();
  int major = 0;
  int minor = 0;
  size_t dot = s.find('.');
  if (dot != std::string_view::npos) {
    if (!absl::SimpleAtoi(Sv(s.substr(0, dot)), &major) ||
        !absl::SimpleAtoi(Sv(s.substr(dot + 1)), &minor) || dot + 2 != s.size()) {
      return bad();
    }
  } else {
    // "90" is 9.0 and "100" is 10.0: the last digit is the minor version.
    for (char c : s) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return bad();
    }
    if (s.size() < 2 || s.size() > 3) return bad();
    int value = 0;
    if (!absl::SimpleAtoi(Sv(s), &value)) return bad();
    major = value / 10;
    minor = value % 10;
  }
  if (major < 1 || minor < 0 || minor > 9) return bad();
  return DeviceSm{major, minor};
}


absl::Status ValidateProblem(const MoeProblem& p) {
  auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("problem ", ToString(p), ": ", Sv(what)));
  };
  if (p.experts < 1) return bad("experts must be at least 1");
  if (p.tokens < 0) return bad("tokens must not be negative");
  if (p.n < 1) return bad("n must be at least 1");
  if (p.k < 1) return bad("k must be at least 1");
  if (IsGated(p.activation) && p.n % 2 != 0) {
    return bad(absl::StrCat("a gated activation (", Sv(ActivationName(p.activation)),
                            ") needs an even n: the two halves are x0 and x1"));
  }
  if (p.sm_count < 0) return bad("sm_count must not be negative");
  if (p.routed_experts < 0 || (p.routed_experts > 0 && p.routed_experts < p.experts)) {
    return bad(absl::StrCat("routed_experts=", p.routed_experts,
                            " must be 0 (the problem's experts) or at least experts=",
                            p.experts, " (a rank serves some of the model's experts)"));
  }
  if (p.routed_experts > 0 && p.routed_top_k == 0) {
    return bad(absl::StrCat("routed_experts=", p.routed_experts,
                            " without routed_top_k: give the top-k the rows were routed "
                            "with, or leave routed_experts 0"));
  }
  const int64_t routed = p.routed_experts > 0 ? p.routed_experts : p.experts;
  if (p.routed_top_k < 0 || p.routed_top_k > routed) {
    return bad(absl::StrCat("routed_top_k=", p.routed_top_k, " must be 0 (balanced rows) or 1..",
                            routed, " (each token picks that many distinct experts of ",
                            routed, ")"));
  }
  return absl::OkStatus();
}

std::string ToString(const MoeProblem& p) {
  std::string s = absl::StrCat(
      Sv(OpName(p.op)), "{weights=", Sv(DataFormatName(p.weight_format)),
      " activations=", Sv(DataFormatName(p.activation_format)),
      " activation=", Sv(ActivationName(p.activation)), " experts=", p.experts,
      " tokens=", p.tokens, " (", p.tokens_per_expert(), "/expert) n=", p.n,
      " k=", p.k, " sm=", p.sm.number());
  if (p.sm_count > 0) absl::StrAppend(&s, " sms=", p.sm_count);
  if (p.bias) absl::StrAppend(&s, " bias");
  if (p.gather_a) absl::StrAppend(&s, " gather_a");
  if (p.routed_top_k > 0) {
    absl::StrAppend(&s, " routed=top", p.routed_top_k, "of",
                    p.routed_experts > 0 ? p.routed_experts : p.experts);
  }
  if (p.output_format.has_value()) {
    absl::StrAppend(&s, " output=", Sv(DataFormatName(*p.output_format)));
  }
  s += "}";
  return s;
}

std::ostream& operator<<(std::ostream& os, const MoeProblem& p) {
  return os << ToString(p);
}

}  // namespace cubist
