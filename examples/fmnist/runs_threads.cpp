// SPDX-License-Identifier: Apache-2.0
// The comparison with its workers on threads (runs.hpp's run_comparison<on_threads>), compiled
// once into fmnist_runs for fmnist_demo and the demo's tests (runs.cmake).
#include "runs.hpp"

template std::vector<fmnist::run_result> fmnist::run_comparison<fmnist::on_threads>(const fmnist::dataset&,
                                                                                    const fmnist::comparison_config&,
                                                                                    const fmnist::progress_callback&,
                                                                                    fmnist::on_threads);
