// goplugin16: a go-plugin 1.6.3 host and plugin, used by Drover's tests
// (host/drover/tests/compat/goplugin16*.rs) to prove wire compatibility with today's go-plugin:
// AutoMTLS, gRPC broker multiplexing, SkipHostEnv and reattach.
//
//	goplugin16 host [-automtls] [-multiplex] [-skip-host-env] [-detach STATEFILE] PLUGIN [ARGS...]
//	    Act as a go-plugin host configured with Drover's cookie: launch the plugin, ping
//	    its health service, call drover.plugin.v1.BasePlugin/PluginInfo, then Kill() it
//	    (GRPCController.Shutdown) and report on stdout, as one JSON object, whether it
//	    exited gracefully and how long launch -> first answer and Shutdown -> exit took.
//	    With -detach, write what a later host needs to reattach (go-plugin's
//	    ReattachConfig and, with -automtls, the TLS material) to STATEFILE (mode 0600)
//	    and exit without killing the plugin.
//
//	goplugin16 reattach STATEFILE
//	    Act as a new go-plugin host: reattach to the plugin STATEFILE describes, call
//	    PluginInfo, Kill() it, and report as above.
//
//	goplugin16 (started by a host, with the cookie in the environment)
//	    Act as a go-plugin 1.6.3 plugin: go-plugin's own services and health, plus
//	    drover.plugin.v1.BasePlugin/PluginInfo naming itself "goplugin16" (so that a
//	    Drover host can prove its identity on reattach). Every other Drover RPC answers
//	    UNIMPLEMENTED. AutoMTLS and PLUGIN_MULTIPLEX_GRPC are handled by go-plugin.
//
// Built in GOPATH mode against the go-plugin 1.6.3 source by scripts/go-plugin-16.sh.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	protov1 "github.com/golang/protobuf/proto"
	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

var handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "DROVER_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "4d52c1a9e8b7f6035d2c1b0a9f8e7d6c",
}

// The name this program gives as a plugin, in its PluginInfo answer.
const pluginName = "goplugin16"

const pluginInfoMethod = "/drover.plugin.v1.BasePlugin/PluginInfo"

// connPlugin hands the raw gRPC connection to the host code.
type connPlugin struct{ plugin.NetRPCUnsupportedPlugin }

func (connPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&basePluginDesc, struct{}{})
	return nil
}

func (connPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return c, nil
}

// rawCodec passes *[]byte through untouched (Drover's messages, for which this program
// has no generated code) and marshals everything else (go-plugin's and gRPC's own
// services) as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	m, ok := v.(protov1.Message)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return protov1.Marshal(m)
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	if b, ok := v.(*[]byte); ok {
		*b = append([]byte(nil), data...)
		return nil
	}
	m, ok := v.(protov1.Message)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	return protov1.Unmarshal(data, m)
}

func (rawCodec) Name() string   { return "proto" }
func (rawCodec) String() string { return "proto" }

// basePluginDesc serves drover.plugin.v1.BasePlugin/PluginInfo only; gRPC answers
// UNIMPLEMENTED for its other methods and for the Driver service.
var basePluginDesc = grpc.ServiceDesc{
	ServiceName: "drover.plugin.v1.BasePlugin",
	HandlerType: (*interface{})(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "PluginInfo",
		Handler: func(_ interface{}, _ context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
			var req []byte
			if err := dec(&req); err != nil {
				return nil, err
			}
			resp := pluginInfoResponse()
			return &resp, nil
		},
	}},
	Streams:  []grpc.StreamDesc{},
	Metadata: "drover/plugin/v1/base.proto",
}

// pluginInfoResponse encodes drover.plugin.v1.PluginInfoResponse{type: DRIVER, name,
// plugin_version, plugin_api_versions: ["1.0.0"]}.
func pluginInfoResponse() []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, 1)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, pluginName)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, "1.6.3")
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendString(b, "1.0.0")
	return b
}

type report struct {
	Ping              string `json:"ping"`
	PluginInfoHex     string `json:"plugin_info_hex"`
	PluginInfoErr     string `json:"plugin_info_error"`
	Protocol          string `json:"protocol"`
	Pid               int    `json:"pid"`
	LaunchToRPCMillis int64  `json:"launch_to_first_rpc_ms"`
	ExitedGracefully  bool   `json:"exited_gracefully"`
	KillMillis        int64  `json:"kill_ms"`
	// From Kill() to the plugin process's end, in µs; -1 when it had not ended 5 s on.
	ExitMicros int64  `json:"exit_us"`
	Detached   bool   `json:"detached"`
	HostLog    string `json:"host_log"`
}

// state is what `host -detach` leaves for `reattach`: go-plugin's ReattachConfig
// fields and the AutoMTLS material the launching host used.
type state struct {
	Network       string `json:"network"`
	Addr          string `json:"addr"`
	Pid           int    `json:"pid"`
	Protocol      string `json:"protocol"`
	ProtocolVer   int    `json:"protocol_version"`
	ClientCertPEM string `json:"client_cert_pem,omitempty"`
	ClientKeyPEM  string `json:"client_key_pem,omitempty"`
	// The plugin's certificate, as the 6th handshake field had it (base64 DER).
	ServerCert string `json:"server_cert,omitempty"`
}

// callPluginInfo pings, dispenses and calls PluginInfo, filling rep.
func callPluginInfo(client *plugin.Client, rep *report) error {
	rpc, err := client.Client()
	if err != nil {
		return fmt.Errorf("launch failed: %w", err)
	}
	rep.Protocol = string(client.Protocol())
	if err := rpc.Ping(); err != nil {
		rep.Ping = err.Error()
	} else {
		rep.Ping = "ok"
	}
	raw, err := rpc.Dispense("driver")
	if err != nil {
		return fmt.Errorf("dispense failed: %w", err)
	}
	conn := raw.(*grpc.ClientConn)
	req := []byte{}
	var resp []byte
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := conn.Invoke(ctx, pluginInfoMethod, &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		rep.PluginInfoErr = err.Error()
	}
	rep.PluginInfoHex = fmt.Sprintf("%x", resp)
	return nil
}

// kill shuts the plugin down through go-plugin and records how that went. Besides
// go-plugin's own verdict it measures when process pid really ended (gone from /proc,
// or a zombie): a reattached plugin is not this host's child, and go-plugin only polls
// for its end once a second.
func kill(client *plugin.Client, pid int, rep *report, logBuf *bytes.Buffer) {
	start := time.Now()
	ended := make(chan time.Duration, 1)
	go func() {
		deadline := start.Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if processEnded(pid) {
				ended <- time.Since(start)
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
		ended <- -1
	}()
	client.Kill()
	rep.KillMillis = time.Since(start).Milliseconds()
	rep.ExitedGracefully = !strings.Contains(logBuf.String(), "plugin failed to exit gracefully")
	rep.ExitMicros = (<-ended).Microseconds()
}

// processEnded: pid is gone or a zombie.
func processEnded(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name, which may contain spaces.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}

func printReport(rep *report, logBuf *bytes.Buffer) {
	rep.HostLog = logBuf.String()
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
}

// clientTLS returns the client certificate and key go-plugin generated for AutoMTLS
// (PEM) and the plugin's certificate (base64 DER, as in the 6th handshake field).
// go-plugin keeps the plugin's certificate only inside a CertPool, which does not give
// it back: it is read from a TLS handshake with the plugin made with the same config.
func clientTLS(cfg *tls.Config, addr net.Addr) (certPEM, keyPEM, serverCert string, err error) {
	if cfg == nil || len(cfg.Certificates) != 1 || len(cfg.Certificates[0].Certificate) == 0 {
		return "", "", "", errors.New("no AutoMTLS client certificate in the client's TLS config")
	}
	if cfg.RootCAs == nil {
		return "", "", "", errors.New("the plugin sent no certificate (no 6th handshake field)")
	}
	cert := cfg.Certificates[0]
	certPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}))
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return "", "", "", err
	}
	keyPEM = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	probe := cfg.Clone()
	probe.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, addr.Network(), addr.String(), probe)
	if err != nil {
		return "", "", "", fmt.Errorf("TLS handshake with the plugin: %w", err)
	}
	defer conn.Close()
	peers := conn.ConnectionState().PeerCertificates
	if len(peers) == 0 {
		return "", "", "", errors.New("the plugin presented no certificate")
	}
	return certPEM, keyPEM, base64.RawStdEncoding.EncodeToString(peers[0].Raw), nil
}

func runHost(args []string) int {
	fs := flag.NewFlagSet("host", flag.ContinueOnError)
	autoMTLS := fs.Bool("automtls", false, "ClientConfig.AutoMTLS")
	multiplex := fs.Bool("multiplex", false, "ClientConfig.GRPCBrokerMultiplex")
	skipHostEnv := fs.Bool("skip-host-env", false, "ClientConfig.SkipHostEnv")
	detach := fs.String("detach", "", "write reattach state here and exit without killing the plugin")
	if err := fs.Parse(args); err != nil || fs.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: goplugin16 host [-automtls] [-multiplex] [-skip-host-env] [-detach STATEFILE] PLUGIN [ARGS...]")
		return 2
	}
	var logBuf bytes.Buffer
	logger := hclog.New(&hclog.LoggerOptions{Name: "host", Output: &logBuf, Level: hclog.Debug})
	cmd := exec.Command(fs.Arg(0), fs.Args()[1:]...)
	cfg := &plugin.ClientConfig{
		HandshakeConfig:     handshake,
		Plugins:             map[string]plugin.Plugin{"driver": connPlugin{}},
		Cmd:                 cmd,
		AllowedProtocols:    []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:              logger,
		StartTimeout:        10 * time.Second,
		AutoMTLS:            *autoMTLS,
		GRPCBrokerMultiplex: *multiplex,
		SkipHostEnv:         *skipHostEnv,
	}
	client := plugin.NewClient(cfg)
	rep := report{}
	start := time.Now()
	if err := callPluginInfo(client, &rep); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n%s", err, logBuf.String())
		client.Kill()
		return 1
	}
	rep.LaunchToRPCMillis = time.Since(start).Milliseconds()
	if cmd.Process != nil {
		rep.Pid = cmd.Process.Pid
	}
	if *detach != "" {
		if err := writeState(*detach, client, cfg); err != nil {
			fmt.Fprintf(os.Stderr, "cannot save reattach state: %v\n", err)
			client.Kill()
			return 1
		}
		rep.Detached = true
		printReport(&rep, &logBuf)
		// Exit without Kill(): the plugin must outlive this host.
		return 0
	}
	kill(client, rep.Pid, &rep, &logBuf)
	printReport(&rep, &logBuf)
	return 0
}

func writeState(path string, client *plugin.Client, cfg *plugin.ClientConfig) error {
	rc := client.ReattachConfig()
	if rc == nil {
		return errors.New("go-plugin has no reattach config")
	}
	st := state{
		Network:     rc.Addr.Network(),
		Addr:        rc.Addr.String(),
		Pid:         rc.Pid,
		Protocol:    string(rc.Protocol),
		ProtocolVer: client.NegotiatedVersion(),
	}
	if cfg.AutoMTLS {
		certPEM, keyPEM, serverCert, err := clientTLS(cfg.TLSConfig, rc.Addr)
		if err != nil {
			return err
		}
		st.ClientCertPEM, st.ClientKeyPEM, st.ServerCert = certPEM, keyPEM, serverCert
	}
	data, err := json.Marshal(&st)
	if err != nil {
		return err
	}
	// The client key is in there: owner only.
	return os.WriteFile(path, data, 0o600)
}

func runReattach(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: goplugin16 reattach STATEFILE")
		return 2
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot read reattach state: %v\n", err)
		return 1
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		fmt.Fprintf(os.Stderr, "bad reattach state %s: %v\n", args[0], err)
		return 1
	}
	var addr net.Addr
	switch st.Network {
	case "unix":
		addr = &net.UnixAddr{Net: "unix", Name: st.Addr}
	case "tcp":
		addr, err = net.ResolveTCPAddr("tcp", st.Addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bad address %q: %v\n", st.Addr, err)
			return 1
		}
	default:
		fmt.Fprintf(os.Stderr, "unknown network %q\n", st.Network)
		return 1
	}
	var tlsConfig *tls.Config
	if st.ClientCertPEM != "" {
		cert, err := tls.X509KeyPair([]byte(st.ClientCertPEM), []byte(st.ClientKeyPEM))
		if err != nil {
			fmt.Fprintf(os.Stderr, "bad client certificate: %v\n", err)
			return 1
		}
		der, err := base64.RawStdEncoding.DecodeString(st.ServerCert)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bad server certificate: %v\n", err)
			return 1
		}
		serverCert, err := x509.ParseCertificate(der)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bad server certificate: %v\n", err)
			return 1
		}
		pool := x509.NewCertPool()
		pool.AddCert(serverCert)
		// What go-plugin builds for AutoMTLS, from the saved material.
		tlsConfig = &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS12,
			ServerName:   "localhost",
			RootCAs:      pool,
			ClientCAs:    pool,
		}
	}
	var logBuf bytes.Buffer
	logger := hclog.New(&hclog.LoggerOptions{Name: "reattach", Output: &logBuf, Level: hclog.Debug})
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  handshake,
		Plugins:          map[string]plugin.Plugin{"driver": connPlugin{}},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           logger,
		TLSConfig:        tlsConfig,
		Reattach: &plugin.ReattachConfig{
			Protocol:        plugin.Protocol(st.Protocol),
			ProtocolVersion: st.ProtocolVer,
			Addr:            addr,
			Pid:             st.Pid,
		},
	})
	rep := report{Pid: st.Pid}
	start := time.Now()
	if err := callPluginInfo(client, &rep); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n%s", err, logBuf.String())
		return 1
	}
	rep.LaunchToRPCMillis = time.Since(start).Milliseconds()
	kill(client, st.Pid, &rep, &logBuf)
	printReport(&rep, &logBuf)
	return 0
}

func main() {
	if len(os.Args) >= 2 {
		switch os.Args[1] {
		case "host":
			os.Exit(runHost(os.Args[2:]))
		case "reattach":
			os.Exit(runReattach(os.Args[2:]))
		}
	}
	if os.Getenv(handshake.MagicCookieKey) == "" {
		fmt.Fprintln(os.Stderr, "usage: goplugin16 host|reattach ...; as a plugin it is started by a go-plugin host")
		os.Exit(2)
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: handshake,
		Plugins:         map[string]plugin.Plugin{"driver": connPlugin{}},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			// Drover's messages arrive as raw bytes (see rawCodec).
			return grpc.NewServer(append(opts, grpc.CustomCodec(rawCodec{}))...)
		},
	})
}
