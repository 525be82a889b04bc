// SPDX-License-Identifier: Apache-2.0
// The comparison with each worker a rank of an MPI communicator (runs.hpp's
// run_comparison<on_rank<collectives::mpi>>), compiled once into fmnist_runs_mpi for fmnist_mpi
// and its test (runs.cmake).
#include "runs.hpp"

template std::vector<fmnist::run_result> fmnist::run_comparison<fmnist::on_rank<bellows::collectives::mpi>>(
    const fmnist::dataset&, const fmnist::comparison_config&, const fmnist::progress_callback&,
    fmnist::on_rank<bellows::collectives::mpi>);
