// Status helpers shared by every host-side part of HSAP.
//
// Abseil 20220623 (Debian 12) ships no RETURN_IF_ERROR / ASSIGN_OR_RETURN, so
// they are written once here.
//
//   HSAP_RETURN_IF_ERROR(registry.Pin(id));
//   HSAP_ASSIGN_OR_RETURN(auto region, registry.Find(id));
#ifndef HSAP_COMMON_STATUS_MACROS_H_
#define HSAP_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define HSAP_STATUS_CONCAT_INNER_(a, b) a##b
#define HSAP_STATUS_CONCAT_(a, b) HSAP_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define HSAP_RETURN_IF_ERROR(expr)                     \
  do {                                                 \
    ::absl::Status hsap_status_ = (expr);              \
    if (!hsap_status_.ok()) return hsap_status_;       \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise move-assigns the value to `lhs` (which may be a declaration).
#define HSAP_ASSIGN_OR_RETURN(lhs, rexpr) \
  HSAP_ASSIGN_OR_RETURN_IMPL_(HSAP_STATUS_CONCAT_(hsap_statusor_, __LINE__), lhs, rexpr)

#define HSAP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // HSAP_COMMON_STATUS_MACROS_H_
