#pragma once
// `gyre ledger`: reads a run's sample ledger (RUN_DIR/ledger.db, controller/sample_ledger.h).

#include <string>
#include <vector>

namespace gyre::cli {

// gyre ledger RUN_DIR [--sample ID | --prompts [--top N] | --state STATE [--top N]] [--json]
int RunLedger(const std::vector<std::string>& args);

}  // namespace gyre::cli
