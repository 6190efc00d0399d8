// goplugin-compat: a real HashiCorp go-plugin program used by Drover's tests to prove
// wire compatibility in both directions.
//
//   goplugin-compat host PLUGIN_BINARY [ARGS...]
//       Act as a go-plugin host configured with Drover's cookie: launch the plugin,
//       ping its health service, call drover.plugin.v1.BasePlugin/PluginInfo over
//       the go-plugin connection, then Kill() it (GRPCController.Shutdown) and
//       report whether it exited gracefully. Prints one JSON object on stdout.
//
//   goplugin-compat (started by a host, with the cookie in the environment)
//       Act as a go-plugin plugin for "another application": it serves go-plugin's
//       own services and health, but none of Drover's.
//
// Built in GOPATH mode against Debian's golang-github-hashicorp-go-plugin-dev.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

var handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "DROVER_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "4d52c1a9e8b7f6035d2c1b0a9f8e7d6c",
}

// connPlugin hands the raw gRPC connection to the host code.
type connPlugin struct{ plugin.NetRPCUnsupportedPlugin }

func (connPlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error { return nil }
func (connPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return c, nil
}

// rawCodec sends and receives protobuf bytes untouched.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

type report struct {
	Ping          string `json:"ping"`
	PluginInfoHex string `json:"plugin_info_hex"`
	PluginInfoErr string `json:"plugin_info_error"`
	Protocol      string `json:"protocol"`
	ExitedInTime  bool   `json:"exited_gracefully"`
	KillMillis    int64  `json:"kill_ms"`
	HostLog       string `json:"host_log"`
}

func runHost(args []string) int {
	var logBuf bytes.Buffer
	logger := hclog.New(&hclog.LoggerOptions{Name: "host", Output: &logBuf, Level: hclog.Debug})
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  handshake,
		Plugins:          map[string]plugin.Plugin{"driver": connPlugin{}},
		Cmd:              exec.Command(args[0], args[1:]...),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           logger,
		StartTimeout:     10 * time.Second,
	})
	rep := report{}
	rpc, err := client.Client()
	if err != nil {
		fmt.Fprintf(os.Stderr, "launch failed: %v\n%s", err, logBuf.String())
		return 1
	}
	rep.Protocol = string(client.Protocol())
	if err := rpc.Ping(); err != nil {
		rep.Ping = err.Error()
	} else {
		rep.Ping = "ok"
	}
	raw, err := rpc.Dispense("driver")
	if err != nil {
		fmt.Fprintf(os.Stderr, "dispense failed: %v\n", err)
		return 1
	}
	conn := raw.(*grpc.ClientConn)
	req := []byte{}
	var resp []byte
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := conn.Invoke(ctx, "/drover.plugin.v1.BasePlugin/PluginInfo", &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		rep.PluginInfoErr = err.Error()
	}
	rep.PluginInfoHex = fmt.Sprintf("%x", resp)
	start := time.Now()
	client.Kill()
	rep.KillMillis = time.Since(start).Milliseconds()
	rep.ExitedInTime = !strings.Contains(logBuf.String(), "plugin failed to exit gracefully")
	rep.HostLog = logBuf.String()
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
	return 0
}

func main() {
	if len(os.Args) >= 3 && os.Args[1] == "host" {
		os.Exit(runHost(os.Args[2:]))
	}
	// A plugin for another application: go-plugin services only.
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: handshake,
		Plugins:         map[string]plugin.Plugin{"other": connPlugin{}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
