// Starting under Slurm's srun without flags (issue 19, item 5).
//
// srun starts every task of a job step with SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID and the step's node list, but none of the torchrun variables
// the c10d backend reads. Where OpenMPI was built with PMI/PMIx, srun
// --mpi=pmix (or pmi2) also sets PMIX_RANK (PMI_RANK) and MPI_Init just
// works: backend_from_environment() picks mpi from those, before anything
// here. Otherwise a Slurm step is a c10d job whose variables are derived:
//   RANK = SLURM_PROCID, WORLD_SIZE = SLURM_NTASKS, LOCAL_RANK = SLURM_LOCALID,
//   MASTER_ADDR = the first host of SLURM_STEP_NODELIST (else SLURM_NODELIST;
//                 Slurm's block distribution puts task 0 there),
//   MASTER_PORT = 15000 + SLURM_JOB_ID mod 15000 (below Linux's ephemeral
//                 ports, the same on every task without talking; two steps of
//                 one job running at once must set MASTER_PORT themselves).
// A variable already set (by the user, or by torchrun run inside srun) wins.
//
// A Slurm step needs SLURM_STEP_ID as well: an sbatch script itself has
// SLURM_PROCID=0 and the job's SLURM_NTASKS, and a `dtrain train --nproc 2`
// run from it must not take itself for rank 0 of the whole allocation.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {

// Slurm's compressed host list, expanded in order: "node[01-03,07],gpu5" is
// node01 node02 node03 node07 gpu5 (zero padding kept, as Slurm writes it).
// Throws CommError on a malformed list.
std::vector<std::string> expand_slurm_hostlist(const std::string& list);

// Reads one environment variable: nullopt when unset or empty.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;

// Whether `env` describes a task of an srun job step (SLURM_STEP_ID,
// SLURM_PROCID and SLURM_NTASKS set).
bool in_slurm_step(const EnvLookup& env);

// The torchrun variables a c10d rank of a Slurm step lacks, with their values
// (see above); empty outside a Slurm step or when RANK or WORLD_SIZE is set.
// Throws CommError naming the Slurm variable when one is malformed.
std::vector<std::pair<std::string, std::string>> c10d_variables_from_slurm(const EnvLookup& env);

// Sets c10d_variables_from_slurm() of the process environment in it, so the
// c10d backend and everything else that reads RANK see the same values.
void export_slurm_variables();

}  // namespace dtrain
