// The page's conversation, over either transport the transport selector names:
// - WebSocket (/api/chat): microphone -> Opus (WebCodecs) -> Ogg pages -> the server; the
//   server's Ogg/Opus -> WebCodecs -> the speakers, its text into the transcript;
// - WebRTC (/v1/realtime/calls, call.js): the browser's own Opus track both ways, the text from
//   the oai-events channel.
// Nothing is fetched from outside this server: the page works offline.

import { startCall, stopCall } from "./call.js";
import { OggOpusWriter, OggReader, isHeaderPacket, opusHead } from "./ogg.js";

const RATE = 24000; // the model's sample rate, both ways
const PACKET = 480; // samples per Opus packet: 20 ms, as the reference web client sends
const LEAD = 0.08; // seconds of answer buffered ahead of playback after an underrun

const $ = (id) => document.getElementById(id);

// What the page knows about its session; also read by the browser test.
const state = (window.personaplex = {
  status: "idle", handshake: false, text: "", textPieces: 0, samplesSent: 0, pagesSent: 0,
  samplesAnswered: 0, answerEnergy: 0, captureEnergy: 0, latencyMs: null, serverFrameP50: null, serverFrameP99: null,
  dropped: null, framesAnswered: null, bufferMs: 0, error: null, closeCode: null,
});

let live = null; // the running session's resources

function setStatus(text) {
  state.status = text;
  $("status").textContent = text;
}

async function showHealth() {
  const health = await fetch("/api/health").then((r) => r.json()).catch(() => ({}));
  if (health.model) {
    $("model").textContent = `${health.model} · ${health.sessions} of ${health.capacity} sessions in use`;
  }
}

async function loadVoices() {
  const voices = await fetch("/api/voices").then((r) => r.json());
  const select = $("voice");
  select.replaceChildren(...voices.voices.map((name) => new Option(name, name)));
  if (voices.default_voice && voices.voices.includes(voices.default_voice)) {
    select.value = voices.default_voice;
  }
  select.disabled = !voices.persona || voices.voices.length === 0;
  $("prompt").value = voices.default_text_prompt;
  $("prompt").disabled = !voices.persona;
  await showHealth();
}

function chatUrl() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const q = new URLSearchParams();
  if (!$("voice").disabled && $("voice").value) q.set("voice_prompt", $("voice").value);
  if (!$("prompt").disabled) q.set("text_prompt", $("prompt").value);
  q.set("stats", "1");
  const token = new URLSearchParams(location.search).get("token");
  if (token) q.set("token", token);
  return `${proto}//${location.host}/api/chat?${q}`;
}

function message(kind, bytes) {
  const out = new Uint8Array(1 + bytes.length);
  out[0] = kind;
  out.set(bytes, 1);
  return out;
}

function concat(chunks) {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) { out.set(c, at); at += c.length; }
  return out;
}

// Round trip: the time since the microphone delivered the sample the answers have reached
// (each answered frame stands for one input frame, so the counts line up).
function updateLatency(s) {
  const marks = s.captureMarks;
  while (marks.length > 1 && marks[1][0] <= state.samplesAnswered) marks.shift();
  if (marks.length && marks[0][0] <= state.samplesAnswered + PACKET) {
    state.latencyMs = performance.now() - marks[0][1];
  }
}

function showFigures() {
  const fmt = (v, unit = " ms") => (v === null || v === undefined ? "–" : `${Math.round(v)}${unit}`);
  $("latency").textContent = fmt(state.latencyMs);
  $("server").textContent = state.serverFrameP50 === null ? "–"
    : `${state.serverFrameP50.toFixed(1)} / ${state.serverFrameP99.toFixed(1)} ms`;
  $("dropped").textContent = state.dropped === null ? "–" : String(state.dropped);
  $("buffer").textContent = fmt(state.bufferMs);
  $("frames").textContent = state.framesAnswered === null ? "–" : String(state.framesAnswered);
}

function play(s, data) {
  const frames = data.numberOfFrames;
  const rate = data.sampleRate; // read before close(), which zeroes it
  const buffer = s.ctx.createBuffer(1, frames, rate);
  data.copyTo(buffer.getChannelData(0), { planeIndex: 0, format: "f32-planar" });
  data.close();
  const source = s.ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(s.ctx.destination);
  const now = s.ctx.currentTime;
  if (s.playHead < now) s.playHead = now + LEAD; // ran dry: start again a little ahead
  source.start(s.playHead);
  s.playHead += buffer.duration;
  state.bufferMs = 1000 * (s.playHead - now);
  state.samplesAnswered += Math.round(frames * RATE / rate);
  const samples = buffer.getChannelData(0);
  for (let i = 0; i < samples.length; i++) state.answerEnergy += samples[i] * samples[i];
  updateLatency(s);
}

function onServerAudio(s, bytes) {
  for (const packet of s.reader.push(bytes)) {
    if (isHeaderPacket(packet)) {
      if (new TextDecoder().decode(packet.subarray(0, 8)) === "OpusHead" &&
          s.decoder.state === "unconfigured") {
        s.decoder.configure({ codec: "opus", sampleRate: RATE, numberOfChannels: 1,
                              description: packet });
      }
      continue;
    }
    if (s.decoder.state !== "configured") continue;
    s.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: s.decodedUs, data: packet }));
    s.decodedUs += 20000;
  }
}

function onMessage(s, event) {
  const bytes = new Uint8Array(event.data);
  if (!bytes.length) return;
  const payload = bytes.subarray(1);
  switch (bytes[0]) {
    case 0x00:
      state.handshake = true;
      setStatus("talking");
      showHealth();
      break;
    case 0x01:
      onServerAudio(s, payload);
      break;
    case 0x02: {
      const piece = new TextDecoder().decode(payload);
      state.text += piece;
      state.textPieces += 1;
      $("text").textContent = state.text;
      break;
    }
    case 0x04: {
      const m = JSON.parse(new TextDecoder().decode(payload));
      state.dropped = m.dropped;
      state.framesAnswered = m.frames;
      if (m.frame_p50_ms !== undefined) {
        state.serverFrameP50 = m.frame_p50_ms;
        state.serverFrameP99 = m.frame_p99_ms;
      }
      break;
    }
    case 0x05:
      state.error = new TextDecoder().decode(payload);
      setStatus(`ended by the server: ${state.error}`);
      break;
    default:
      break; // kinds this page does not show
  }
}

function onCapture(s, block) {
  if (!state.handshake || s.ws.readyState !== WebSocket.OPEN) return; // the server is not listening yet
  for (let i = 0; i < block.length; i++) state.captureEnergy += block[i] * block[i];
  s.pending.push(block);
  s.pendingSamples += block.length;
  while (s.pendingSamples >= PACKET) {
    const samples = new Float32Array(PACKET);
    let filled = 0;
    while (filled < PACKET) {
      const head = s.pending[0];
      const take = Math.min(head.length, PACKET - filled);
      samples.set(head.subarray(0, take), filled);
      filled += take;
      if (take === head.length) s.pending.shift(); else s.pending[0] = head.subarray(take);
    }
    s.pendingSamples -= PACKET;
    const data = new AudioData({ format: "f32", sampleRate: RATE, numberOfFrames: PACKET,
                                 numberOfChannels: 1, timestamp: s.encodedUs, data: samples });
    s.encodedUs += 20000;
    s.encoder.encode(data);
    data.close();
    state.samplesSent += PACKET;
    s.captureMarks.push([state.samplesSent, performance.now()]);
  }
}

function onEncoded(s, chunk, meta) {
  if (!s.writer) {
    // the encoder's own OpusHead (it knows its pre-skip) where it gives one
    const d = meta && meta.decoderConfig && meta.decoderConfig.description;
    const head = d && d.byteLength >= 19 ? new Uint8Array(d instanceof ArrayBuffer ? d : d.buffer) : null;
    const valid = head && new TextDecoder().decode(head.subarray(0, 8)) === "OpusHead";
    s.writer = new OggOpusWriter({ head: valid ? head : opusHead({ inputRate: RATE }) });
    s.ws.send(message(0x01, concat(s.writer.headers())));
  }
  const packet = new Uint8Array(chunk.byteLength);
  chunk.copyTo(packet);
  const samples48k = chunk.duration ? Math.round(chunk.duration * 48 / 1000) : 960;
  const page = s.writer.add(packet, samples48k);
  if (page && s.ws.readyState === WebSocket.OPEN) {
    s.ws.send(message(0x01, page));
    state.pagesSent += 1;
  }
}

function resetState(transport) {
  Object.assign(state, { transport, handshake: false, text: "", textPieces: 0, samplesSent: 0,
    pagesSent: 0, samplesAnswered: 0, answerEnergy: 0, captureEnergy: 0, latencyMs: null,
    dropped: null, framesAnswered: null, error: null, closeCode: null, serverFrameP50: null,
    serverFrameP99: null, bufferMs: 0 });
  $("text").textContent = "";
}

function goLive(s) {
  live = s;
  $("connect").textContent = "Stop";
  $("connect").classList.add("live");
}

async function startWebRtc() {
  resetState("webrtc");
  const persona = { voice: $("voice").disabled ? null : $("voice").value,
                    prompt: $("prompt").disabled ? null : $("prompt").value };
  const ui = { state, setStatus, showFigures, onStop: () => stop() };
  const token = new URLSearchParams(location.search).get("token");
  goLive({ call: await startCall(ui, persona, token) });
}

async function start() {
  if (typeof AudioEncoder === "undefined" || typeof AudioDecoder === "undefined") {
    throw new Error("this browser has no WebCodecs audio (AudioEncoder); use a recent Chrome, Edge, Safari or Firefox");
  }
  setStatus("starting the microphone");
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
  });
  const ctx = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" });
  await ctx.audioWorklet.addModule("/static/capture-worklet.js");
  const s = {
    ctx, stream, ws: null, reader: new OggReader(), writer: null, pending: [], pendingSamples: 0,
    encodedUs: 0, decodedUs: 0, playHead: 0, captureMarks: [], timer: null,
  };
  resetState("websocket");
  s.encoder = new AudioEncoder({
    output: (chunk, meta) => onEncoded(s, chunk, meta),
    error: (e) => fail(`Opus encoder: ${e.message}`),
  });
  s.encoder.configure({ codec: "opus", sampleRate: RATE, numberOfChannels: 1, bitrate: 32000,
                        opus: { frameDuration: 20000 } });
  s.decoder = new AudioDecoder({ output: (d) => play(s, d), error: (e) => fail(`Opus decoder: ${e.message}`) });
  const source = ctx.createMediaStreamSource(stream);
  const capture = new AudioWorkletNode(ctx, "capture");
  capture.port.onmessage = (e) => onCapture(s, e.data);
  const mute = ctx.createGain(); // pulls the worklet without sending the microphone to the speakers
  mute.gain.value = 0;
  source.connect(capture).connect(mute).connect(ctx.destination);

  setStatus("preparing the persona");
  s.ws = new WebSocket(chatUrl());
  s.ws.binaryType = "arraybuffer";
  s.ws.onmessage = (e) => onMessage(s, e);
  s.ws.onclose = (e) => {
    state.closeCode = e.code;
    if (!state.error) setStatus(e.code === 1000 || e.code === 1005 ? "closed" : `closed (${e.code})`);
    stop(false);
  };
  s.ws.onerror = () => { if (!state.error) setStatus("connection failed"); };
  s.timer = setInterval(showFigures, 250);
  goLive(s);
}

function stop(closeSocket = true) {
  const s = live;
  if (!s) return;
  live = null;
  if (s.call) {
    stopCall(s.call);
    showFigures();
    $("connect").textContent = "Talk";
    $("connect").classList.remove("live");
    if (state.status === "talking") setStatus("stopped");
    showHealth();
    return;
  }
  clearInterval(s.timer);
  showFigures();
  if (closeSocket && s.ws && s.ws.readyState <= WebSocket.OPEN) s.ws.close(1000);
  for (const track of s.stream.getTracks()) track.stop();
  for (const codec of [s.encoder, s.decoder]) { try { codec.close(); } catch (_) { /* closed */ } }
  s.ctx.close();
  $("connect").textContent = "Talk";
  $("connect").classList.remove("live");
  if (state.status === "talking") setStatus("stopped");
  showHealth();
}

function fail(reason) {
  state.error = reason;
  setStatus(reason);
  stop();
}

$("connect").addEventListener("click", () => {
  if (live) stop();
  else ($("transport").value === "webrtc" ? startWebRtc() : start())
    .catch((e) => fail(e.message || String(e)));
});
loadVoices().catch((e) => setStatus(`cannot read /api/voices: ${e.message}`));
