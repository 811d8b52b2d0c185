// This process's memory as Linux reports it (/proc/self), for the logs and
// the checkpoint records: resident now, and the high-water mark since the
// last reset. 0 where /proc is not there.
#pragma once

namespace attnres {

// Resident set size now (VmRSS), MiB.
double rss_mib();
// Peak resident set size (VmHWM), MiB: since the process started or since
// the last reset_peak_rss().
double peak_rss_mib();
// Starts a new high-water mark at the current resident size
// (/proc/self/clear_refs "5"); ignored where that file cannot be written.
void reset_peak_rss();

}  // namespace attnres
