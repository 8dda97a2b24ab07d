// Whether every rank will reduce its units' gradients in the same order.
//
// Note [reduction order]
// Gradient reductions are collectives: every rank must issue them in the
// same order. Normally a unit reduces as soon as its last gradient arrives
// (overlapping backward), and units whose gradients are incomplete reduce at
// the end of backward in unit order. With data-dependent control flow (a
// branch, a routed expert) a unit can be complete on one rank and partial or
// unused on another, and the ranks would issue their reductions in different
// orders: a hang, or, for units of equal size, gradients silently mixed.
//
// So at the end of each training forward the ranks compare, in one small
// all-reduce, which units this forward entered (in order) and which units'
// parameters the autograd graph reaches (all, some, none). When every rank
// agrees, backward reduces eagerly as before. When any differs, this step's
// backward keeps each unit's gradients locally and reduces every unit that
// some rank used at the end of backward, in unit order (a unit no rank used
// keeps no gradient, as in single-process training). That step holds each
// unit's full-size gradient until the end of backward: DDP's memory for
// gradients, in the steps that need it only.
#pragma once

#include "fsdp/unit.h"

#include <dtrain/comm.h>

#include <torch/types.h>

#include <memory>
#include <vector>

namespace dtrain::detail {

struct ReductionOrder {
  bool eager = true;               // every rank agrees: reduce as units complete
  std::vector<char> used_anywhere; // per unit: some rank's graph reaches its parameters
};

// Collective over `comm` (every rank's training forward calls it once).
ReductionOrder agree_on_reduction_order(Communicator& comm, const std::vector<std::unique_ptr<Unit>>& units,
                                        const std::vector<Unit*>& this_forward, const torch::Tensor& output);

}  // namespace dtrain::detail
