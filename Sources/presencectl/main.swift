import EventLoop
import PresenceCtl

SignalWaiter.blockTermination()  // on the main thread, before any other thread starts
await PresenceCtl.main(Array(CommandLine.arguments.dropFirst()))
