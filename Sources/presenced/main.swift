import PresenceNode

NodeMain.run()
