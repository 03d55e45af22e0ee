package transport

import "github.com/openeuler/urma-k8s/pkg/transport/handshake"

func appendHello(dst []byte, v handshake.Version, h handshake.Hello) []byte {
	if v == handshake.V3 {
		return handshake.AppendV3(dst, h)
	}
	return handshake.AppendV2(dst, h)
}

func appendFallbackHello(dst []byte, v handshake.Version) []byte {
	if v == handshake.V3 {
		return handshake.AppendV3Fallback(dst)
	}
	return handshake.AppendV2Fallback(dst)
}

func magicOf(v handshake.Version) string {
	if v == handshake.V3 {
		return handshake.MagicV3
	}
	return handshake.MagicV2
}
