// Package soft is the software URMA provider: virtual devices that move real
// bytes with the semantics of UB hardware, for every machine without it.
//
// Two fabrics connect devices. The in-process fabric (NewFabric) joins the
// Providers of one process, as if each were a host, and copies a message once,
// from the sender's registered memory straight into the posted receive buffer.
// The socket fabric gives each device a TCP listener whose address its EID
// encodes (see SocketEID); devices reach each other over exactly one TCP
// connection per pair, multiplexing every jetty, with the small framed
// protocol documented in docs/software-provider.md.
//
// What hardware does, this provider does: queue depths are enforced (ErrAgain),
// receivers that have no buffer posted make the sender retry (RNR), a too small
// buffer completes with LOC_LEN, tokens are checked by the target on every
// message (never at import, as on hardware), a send error puts the jetty into ERROR and flushes what is
// outstanding, a vanished peer turns outstanding sends into ACK_TIMEOUT
// completions, and completion events arrive on a Linux eventfd. Where this
// provider chooses differently from hardware (completion queue overflow, the
// retry timer scale), docs/software-provider.md says so.
package soft
