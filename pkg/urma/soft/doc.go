// Package soft is the software URMA provider: virtual devices that move real
// bytes with the semantics of UB hardware, for every machine without it.
//
// Three fabrics connect devices. The in-process fabric (NewFabric) joins the
// Providers of one process, as if each were a host, and copies a message once,
// from the sender's registered memory straight into the posted receive buffer.
// The socket fabric gives each device a TCP listener whose address its EID
// encodes (see SocketEID); devices reach each other over exactly one TCP
// connection per pair, multiplexing every jetty, with the small framed
// protocol documented in docs/software-provider.md. The shm fabric
// (Options.ShmDir) joins the processes of one host: devices meet at unix
// sockets, prove their EIDs with a key (see ShmEIDOfKey), and carry the
// same frames through a pair of shared-memory rings per pair of devices.
//
// What hardware does, this provider does: queue depths are enforced (ErrAgain),
// receivers that have no buffer posted make the sender retry (RNR), a too small
// buffer completes with LOC_LEN, tokens are checked by the target on every
// message (never at import, as on hardware), a send error puts the jetty into ERROR and flushes what is
// outstanding, a vanished peer turns outstanding sends into ACK_TIMEOUT
// completions, and completion events arrive on a Linux eventfd. Where this
// provider chooses differently from hardware (completion queue overflow, the
// retry timer scale), docs/software-provider.md says so.
//
// Every peer is hostile: whatever a peer sends or names (frames, lengths,
// handles, descriptors, identities) is checked and bounded before use, a
// violation ends its connection and nothing else, and what a peer can make
// this side hold (connections, RNR blocks, answers owed, mapped segments)
// is bounded by a constant or an Option that the refusal names.
//
// The package holds the verbs (the device, its contexts, jetties, JFRs,
// JFCs, segments and imports) and the link between processes (fabricSide:
// a device's listener, peers and connections; the handshakes; the import
// RPC; the watchdog). The shared memory of the shm fabric is
// internal/shmring; docs/architecture.md lists every file.
package soft
