import PresenceCtl

await PresenceCtl.main(Array(CommandLine.arguments.dropFirst()))
