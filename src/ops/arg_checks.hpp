// The argument checks moved to core/arg_checks.hpp (the cache, the engine and
// the scheduler use them too); this name stays for the files that include it.
#pragma once

#include "core/arg_checks.hpp"
