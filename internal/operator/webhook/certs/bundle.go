package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Bundle is the CA and serving certificate kept in the Secret.
type Bundle struct {
	CACert     *x509.Certificate
	CAKey      *ecdsa.PrivateKey
	PreviousCA *x509.Certificate
	ServerCert *x509.Certificate
	ServerKey  *ecdsa.PrivateKey
}

// Data is the Secret's data for the bundle.
func (b *Bundle) Data() map[string][]byte {
	d := map[string][]byte{
		KeyCA:    certPEM(b.CACert),
		KeyCAKey: keyPEM(b.CAKey),
		KeyCert:  b.ServerCertPEM(),
		KeyKey:   b.ServerKeyPEM(),
	}
	if b.PreviousCA != nil {
		d[KeyPreviousCA] = certPEM(b.PreviousCA)
	}
	return d
}

// CABundle is what webhook configurations trust: the CA, and the previous
// CA while it is valid.
func (b *Bundle) CABundle() []byte {
	out := certPEM(b.CACert)
	if b.PreviousCA != nil {
		out = append(out, certPEM(b.PreviousCA)...)
	}
	return out
}

// ServerCertPEM is the serving certificate.
func (b *Bundle) ServerCertPEM() []byte { return certPEM(b.ServerCert) }

// ServerKeyPEM is the serving key.
func (b *Bundle) ServerKeyPEM() []byte { return keyPEM(b.ServerKey) }

// ParseBundle reads a Secret's data; it fails naming the first key that is
// missing or malformed.
func ParseBundle(d map[string][]byte) (*Bundle, error) {
	var b Bundle
	var err error
	if b.CACert, err = parseCert(d, KeyCA); err != nil {
		return nil, err
	}
	if b.CAKey, err = parseKey(d, KeyCAKey); err != nil {
		return nil, err
	}
	if b.ServerCert, err = parseCert(d, KeyCert); err != nil {
		return nil, err
	}
	if b.ServerKey, err = parseKey(d, KeyKey); err != nil {
		return nil, err
	}
	if _, ok := d[KeyPreviousCA]; ok {
		if b.PreviousCA, err = parseCert(d, KeyPreviousCA); err != nil {
			return nil, err
		}
	}
	if !b.CAKey.PublicKey.Equal(b.CACert.PublicKey) {
		return nil, fmt.Errorf("%s does not match %s", KeyCAKey, KeyCA)
	}
	if !b.ServerKey.PublicKey.Equal(b.ServerCert.PublicKey) {
		return nil, fmt.Errorf("%s does not match %s", KeyKey, KeyCert)
	}
	return &b, nil
}

func parseCert(d map[string][]byte, key string) (*x509.Certificate, error) {
	blk, _ := pem.Decode(d[key])
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("secret key %s: no PEM certificate", key)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("secret key %s: %w", key, err)
	}
	return c, nil
}

func parseKey(d map[string][]byte, key string) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(d[key])
	if blk == nil || blk.Type != "EC PRIVATE KEY" {
		return nil, fmt.Errorf("secret key %s: no PEM EC private key", key)
	}
	k, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("secret key %s: %w", key, err)
	}
	return k, nil
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func keyPEM(k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		panic(fmt.Sprintf("marshal a P-256 key we generated: %v", err)) // cannot happen for P-256
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial number: %w", err)
	}
	return n, nil
}

func newCA(now time.Time, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("urma-operator webhook CA %d", now.Unix())},
		NotBefore:             now.Add(-time.Hour), // tolerate clock skew between replicas
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return cert, key, nil
}

func newServerCert(now time.Time, validity time.Duration, ca *x509.Certificate, caKey *ecdsa.PrivateKey, dnsNames []string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	if len(dnsNames) == 0 {
		return nil, nil, errors.New("serving certificate needs at least one DNS name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate serving key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("create serving certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse serving certificate: %w", err)
	}
	return cert, key, nil
}
