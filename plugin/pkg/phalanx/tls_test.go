package phalanx

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/klog/v2"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func issue(t *testing.T, parent *testCA, cn string, usage x509.ExtKeyUsage, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: isCA}
	if !isCA {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	}
	signer, signKey := tmpl, key
	if parent != nil {
		signer, signKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func newCA(t *testing.T, name string) *testCA {
	cert, key, certPEM, _ := issue(t, nil, name, 0, true)
	return &testCA{cert: cert, key: key, pem: certPEM}
}

// serveHealth: a gRPC server with ca's serving certificate, requiring client certificates ca signed.
func serveHealth(t *testing.T, ca *testCA) string {
	_, _, certPEM, keyPEM := issue(t, ca, "phalanx-serve", x509.ExtKeyUsageServerAuth, false)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	clients := x509.NewCertPool()
	clients.AddCert(ca.cert)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair},
		ClientCAs: clients, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// writeFiles puts ca's PEM and a client pair it signed at the args' paths, each by rename (as a
// Secret volume swaps its files).
func writeFiles(t *testing.T, a TLSArgs, ca *testCA) {
	_, _, certPEM, keyPEM := issue(t, ca, "phalanx-scheduler", x509.ExtKeyUsageClientAuth, false)
	for path, data := range map[string][]byte{a.CAFile: ca.pem, a.CertFile: certPEM, a.KeyFile: keyPEM} {
		tmp := path + ".new"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
}

func check(creds credentials.TransportCredentials, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestTLSDialsWithClientCertificateAndFollowsRotatedFiles(t *testing.T) {
	dir := t.TempDir()
	args := TLSArgs{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"),
		KeyFile: filepath.Join(dir, "tls.key")}
	first, second := newCA(t, "first"), newCA(t, "second")
	addrFirst, addrSecond := serveHealth(t, first), serveHealth(t, second)
	writeFiles(t, args, first)
	cfg, files, err := clientTLS(args, klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	creds := credentials.NewTLS(cfg)
	if err := check(creds, addrFirst); err != nil {
		t.Fatalf("mTLS with the first CA's files: %v", err)
	}
	if err := check(creds, addrSecond); err == nil {
		t.Fatal("a server the CA file does not vouch for was accepted")
	}
	writeFiles(t, args, second) // rotation: new CA file, new client pair
	if err := check(creds, addrSecond); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	if err := check(creds, addrFirst); err == nil {
		t.Fatal("the old CA still trusted after rotation")
	}
	if err := os.WriteFile(args.CertFile, []byte("half-written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := check(creds, addrSecond); err != nil {
		t.Fatalf("a half-written certificate must keep the previous pair: %v", err)
	}
	if files.loads != 2 {
		t.Fatalf("files loaded %d times, want 2 (start, rotation)", files.loads)
	}
}

func TestTLSServerNameIsChecked(t *testing.T) {
	dir := t.TempDir()
	args := TLSArgs{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"),
		KeyFile: filepath.Join(dir, "tls.key"), ServerName: "phalanx.elsewhere.svc"}
	ca := newCA(t, "ca")
	addr := serveHealth(t, ca) // its certificate names 127.0.0.1 only
	writeFiles(t, args, ca)
	creds, err := transportCredentials(args, klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := check(creds, addr); err == nil || !strings.Contains(err.Error(), "phalanx.elsewhere.svc") {
		t.Fatalf("want a name mismatch, got %v", err)
	}
}

func TestTLSArgsNeedAllThreeFilesAndReadableOnes(t *testing.T) {
	if _, err := (Args{TLS: &TLSArgs{CAFile: "ca.crt", CertFile: "tls.crt"}}).Defaulted(); err == nil ||
		!strings.Contains(err.Error(), "keyFile") {
		t.Fatalf("want keyFile asked for, got %v", err)
	}
	if _, err := (Args{}).Defaulted(); err != nil {
		t.Fatalf("no tls: plaintext as before, got %v", err)
	}
	missing := TLSArgs{CAFile: "/nonexistent/ca", CertFile: "/nonexistent/c", KeyFile: "/nonexistent/k"}
	if _, err := transportCredentials(missing, klog.Background()); err == nil {
		t.Fatal("missing files must fail at start")
	}
}
