// Byte sizes as people write them in experiment files ("24GiB", "1.5 GiB", "2GB") and as llmctl
// prints them.
//
// Units are explicit about their base because the difference matters for GPU memory: an "80GB" A100
// holds 80 GiB-ish of allocator-visible memory, and the labs divided by 1024**3 while printing
// "GB". llmctl always prints binary units (GiB) and says so.
#ifndef LLMCTL_COMMON_BYTE_SIZE_H_
#define LLMCTL_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl {

// Parses a non-negative byte count: a decimal number (fraction allowed) followed, optionally after
// spaces, by a unit. Units (case-insensitive): B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB,
// TiB (powers of 1024). No unit means bytes. Examples: "1024" -> 1024, "512MiB" -> 536870912,
// "1.5GiB" -> 1610612736, "2GB" -> 2000000000. A fractional size is rounded to the nearest byte; a
// fraction of a plain byte ("1.5", "1.5B") is an error. Returns InvalidArgument naming the text and
// the accepted forms, or OutOfRange when the value does not fit in 64 bits.
StatusOr<uint64_t> ParseByteSize(std::string_view text);

// "0.52 GiB": bytes / 2^30 with two decimals, for tables whose column is always GiB.
std::string FormatGiB(uint64_t bytes);

// Human-readable size in the largest binary unit that keeps the number at least 1: "512 B", "1.50
// KiB", "12.25 MiB", "30.41 GiB", "2.00 TiB" (two decimals for every unit above B).
std::string FormatBytes(uint64_t bytes);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_BYTE_SIZE_H_
