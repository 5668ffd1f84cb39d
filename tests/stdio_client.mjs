// A client of `personaplex-edge stdio` written in another language, as an app would: spawn the
// process, stream a wav's PCM16 in messages of odd sizes, read the framed answers, check them.
//
//   node stdio_client.mjs IN.wav ANSWER.raw -- COMMAND ARGS...
//
// Prints one JSON line: {frames, samples, pieces, handshakeFirst, exit}; exits 1 on a
// violation of the protocol.
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";

const [input, answerPath, dashes, command, ...args] = process.argv.slice(2);
if (dashes !== "--") throw new Error("usage: stdio_client.mjs IN.wav ANSWER.raw -- COMMAND ...");

function wavSamples(path) {
  // the PCM16 samples of a mono 24 kHz wav, from its RIFF chunks
  const wav = readFileSync(path);
  let fmt = null;
  for (let pos = 12; pos + 8 <= wav.length;) {
    const id = wav.toString("ascii", pos, pos + 4);
    const size = wav.readUInt32LE(pos + 4);
    if (id === "fmt ") fmt = { channels: wav.readUInt16LE(pos + 10), rate: wav.readUInt32LE(pos + 12), bits: wav.readUInt16LE(pos + 22) };
    if (id === "data") {
      if (!fmt || fmt.channels !== 1 || fmt.rate !== 24000 || fmt.bits !== 16) throw new Error(`not 24 kHz mono PCM16: ${JSON.stringify(fmt)}`);
      return wav.subarray(pos + 8, pos + 8 + size);
    }
    pos += 8 + size + (size & 1);
  }
  throw new Error("no data chunk");
}

function message(kind, payload) {
  const head = Buffer.alloc(5);
  head.writeUInt32LE(payload.length + 1, 0);
  head[4] = kind;
  return Buffer.concat([head, payload]);
}

const pcm = wavSamples(input);
const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
const sizes = [4001, 777, 3840, 1];  // pieces that do not line up with frames, an odd byte too
for (let pos = 0, i = 0; pos < pcm.length; i++) {
  const size = sizes[i % sizes.length];
  child.stdin.write(message(0x01, pcm.subarray(pos, pos + size)));
  pos += size;
}
child.stdin.end();

let buffered = Buffer.alloc(0);
const kinds = [];
const audio = [];
const pieces = [];
let violation = null;
child.stdout.on("data", (chunk) => {
  buffered = Buffer.concat([buffered, chunk]);
  while (buffered.length >= 4 && buffered.length >= 4 + buffered.readUInt32LE(0)) {
    const length = buffered.readUInt32LE(0);
    const kind = buffered[4];
    const payload = buffered.subarray(5, 4 + length);
    buffered = buffered.subarray(4 + length);
    kinds.push(kind);
    if (kind === 0x01) {
      if (payload.length !== 3840) violation = `an audio message of ${payload.length} bytes`;
      audio.push(Buffer.from(payload));
    } else if (kind === 0x02) {
      pieces.push(payload.toString("utf8"));
    } else if (kind === 0x05) {
      violation = `error: ${payload.toString("utf8")}`;
    } else if (kind !== 0x00) {
      violation = `unexpected kind ${kind}`;
    }
  }
});
child.on("close", (code) => {
  const samples = pcm.length / 2;
  const frames = audio.length;
  if (buffered.length) violation = `${buffered.length} bytes of a message left at the end`;
  if (frames !== Math.ceil(samples / 1920)) violation = `${frames} frames for ${samples} samples`;
  const handshakeFirst = kinds[0] === 0x00 && kinds.filter((k) => k === 0x00).length === 1;
  writeFileSync(answerPath, Buffer.concat(audio));
  console.log(JSON.stringify({ frames, samples, pieces, handshakeFirst, exit: code, violation }));
  process.exit(violation || !handshakeFirst || code !== 0 ? 1 : 0);
});
