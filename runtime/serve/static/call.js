// The page's conversation over WebRTC, as OpenAI's browser clients make it: the microphone's
// track and an `oai-events` data channel offered, the offer POSTed to /v1/realtime/calls with
// the persona as the call's session, the answer's track played, the transcript from the
// events. The browser does the Opus, the jitter buffer and the echo cancellation.

const RATE = 24000; // the model's frames, which the figures count in

// ui: {state, setStatus, showFigures, fail, onStop}; persona: {voice, prompt}; token: or null
export async function startCall(ui, persona, token) {
  const { state } = ui;
  ui.setStatus("starting the microphone");
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: {
      echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1,
    },
  });
  const pc = new RTCPeerConnection();
  const player = document.createElement("audio");
  player.autoplay = true;
  pc.ontrack = (e) => { player.srcObject = e.streams[0]; };
  pc.addTrack(stream.getAudioTracks()[0], stream);
  const events = pc.createDataChannel("oai-events");
  events.onmessage = (e) => onEvent(ui, JSON.parse(e.data));
  await pc.setLocalDescription(await pc.createOffer());

  ui.setStatus("preparing the persona");
  const session = { type: "realtime", audio: { output: {} } };
  if (persona.voice) session.audio.output.voice = persona.voice;
  if (persona.prompt !== null) session.instructions = persona.prompt;
  const form = new FormData();
  form.set("sdp", pc.localDescription.sdp);
  form.set("session", JSON.stringify(session));
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch("/v1/realtime/calls", { method: "POST", body: form, headers });
  if (response.status !== 201) {
    const body = await response.json().catch(() => ({}));
    pc.close();
    for (const track of stream.getTracks()) track.stop();
    throw new Error((body.error && body.error.message) ||
                    `the call was refused (${response.status})`);
  }
  await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
  const call = { pc, stream, player, location: response.headers.get("Location"), timer: null };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "connected") {
      state.handshake = true;
      ui.setStatus("talking");
    } else if (pc.connectionState === "failed" || pc.connectionState === "closed") {
      if (!state.error) ui.setStatus(`call ${pc.connectionState}`);
      ui.onStop();
    }
  };
  call.timer = setInterval(() => readStats(ui, pc), 250);
  return call;
}

export function stopCall(call) {
  clearInterval(call.timer);
  call.pc.close();
  for (const track of call.stream.getTracks()) track.stop();
  call.player.srcObject = null;
}

function onEvent(ui, event) {
  const { state } = ui;
  if (event.type === "response.output_audio_transcript.delta") {
    state.text += event.delta;
    state.textPieces += 1;
    document.getElementById("text").textContent = state.text;
  } else if (event.type === "error") {
    state.error = event.error.message;
    ui.setStatus(`the server: ${state.error}`);
  }
}

// The browser's own account of the call: what it heard, lost and buffered, the round trip.
async function readStats(ui, pc) {
  const { state } = ui;
  (await pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      state.samplesAnswered = Math.round((s.totalSamplesReceived || 0) * RATE / 48000);
      state.answerEnergy = s.totalAudioEnergy || 0;
      state.dropped = s.packetsLost || 0;
      state.framesAnswered = Math.floor(state.samplesAnswered / 1920);
      if (s.jitterBufferEmittedCount) {
        state.bufferMs = 1000 * s.jitterBufferDelay / s.jitterBufferEmittedCount;
      }
    } else if (s.type === "candidate-pair" && s.nominated &&
               s.currentRoundTripTime !== undefined) {
      state.latencyMs = 1000 * s.currentRoundTripTime;
    }
  });
  ui.showFigures();
}
