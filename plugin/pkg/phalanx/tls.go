// mTLS to phalanx serve's gRPC endpoint (args.tls), when the two do not share a pod's loopback.
// The client certificate and the CA that must have signed serve's certificate are files (Secret
// volumes), re-read when they change: each new handshake stats them and loads them again when
// one is different, so a rotated certificate is used from the next connection on without a
// restart. A file caught half-written keeps the previous pair (logged); without a previous one
// the handshake fails and the call is retried under the breaker as any transport failure.

package phalanx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"

	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"
)

// TLSArgs: the files of the plugin's client side of mTLS (phalanx serve's --grpc-client-ca must
// have signed CertFile; CAFile must have signed serve's --grpc-tls-cert).
type TLSArgs struct {
	// PEM CA bundle that signed phalanx serve's gRPC certificate.
	CAFile string `json:"caFile,omitempty"`
	// PEM client certificate and its key, presented to phalanx serve.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// The name serve's certificate must carry. Default: the host of address.
	ServerName string `json:"serverName,omitempty"`
}

func (t *TLSArgs) validate() error {
	if t == nil {
		return nil
	}
	if t.CAFile == "" || t.CertFile == "" || t.KeyFile == "" {
		return errors.New("phalanx plugin args: tls needs caFile, certFile and keyFile (mTLS)")
	}
	return nil
}

type fileStamp struct {
	info os.FileInfo
}

func (s fileStamp) same(info os.FileInfo) bool {
	return s.info != nil && os.SameFile(s.info, info) && s.info.ModTime().Equal(info.ModTime()) &&
		s.info.Size() == info.Size()
}

// tlsFiles holds the last good client pair and CA pool read from the files.
type tlsFiles struct {
	args   TLSArgs
	logger klog.Logger

	mu     sync.Mutex
	stamps [3]fileStamp
	pair   *tls.Certificate
	pool   *x509.CertPool
	loads  int // how many times the files were (re)read successfully
}

// current returns the pair and pool, reading the files again when any of them changed.
func (f *tlsFiles) current() (*tls.Certificate, *x509.CertPool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	paths := [3]string{f.args.CAFile, f.args.CertFile, f.args.KeyFile}
	var infos [3]os.FileInfo
	changed := false
	for i, p := range paths {
		info, err := os.Stat(p) // follows the symlinks a Secret volume swaps
		if err != nil {
			return f.keep(fmt.Errorf("phalanx plugin tls: %w", err))
		}
		infos[i] = info
		changed = changed || !f.stamps[i].same(info)
	}
	if !changed {
		return f.pair, f.pool, nil
	}
	pair, pool, err := readTLSFiles(f.args)
	if err != nil {
		return f.keep(err)
	}
	for i := range infos {
		f.stamps[i] = fileStamp{infos[i]}
	}
	f.pair, f.pool = pair, pool
	f.loads++
	if f.loads > 1 {
		f.logger.Info("phalanx plugin: TLS files changed, reloaded", "cert", f.args.CertFile, "ca", f.args.CAFile)
	}
	return pair, pool, nil
}

// keep answers with the last good files after a failed read (the error when there are none).
func (f *tlsFiles) keep(err error) (*tls.Certificate, *x509.CertPool, error) {
	if f.pair == nil {
		return nil, nil, err
	}
	f.logger.Error(err, "phalanx plugin: TLS files cannot be read, keeping the previous ones")
	return f.pair, f.pool, nil
}

func readTLSFiles(a TLSArgs) (*tls.Certificate, *x509.CertPool, error) {
	pair, err := tls.LoadX509KeyPair(a.CertFile, a.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("phalanx plugin tls: client certificate: %w", err)
	}
	ca, err := os.ReadFile(a.CAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("phalanx plugin tls: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, nil, fmt.Errorf("phalanx plugin tls: no PEM certificate in %s", a.CAFile)
	}
	return &pair, pool, nil
}

// clientTLS is the tls.Config of the connection to serve. Go's own verification would use a CA
// pool fixed at construction, so it is switched off and done in VerifyConnection against the
// current pool instead, with the same checks (chain to the CA, the server name, server usage).
func clientTLS(a TLSArgs, logger klog.Logger) (*tls.Config, *tlsFiles, error) {
	files := &tlsFiles{args: a, logger: logger}
	if _, _, err := files.current(); err != nil { // unreadable files at start fail New
		return nil, nil, err
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         a.ServerName,
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection, against the reloaded CA
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			pair, _, err := files.current()
			return pair, err
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, pool, err := files.current()
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("phalanx plugin tls: phalanx serve presented no certificate")
			}
			intermediates := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				intermediates.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: intermediates,
				DNSName: cs.ServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		},
	}
	return cfg, files, nil
}

// transportCredentials: mTLS credentials of a.
func transportCredentials(a TLSArgs, logger klog.Logger) (credentials.TransportCredentials, error) {
	cfg, _, err := clientTLS(a, logger)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}
